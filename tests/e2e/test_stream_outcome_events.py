"""A finished stream's events are decoded again for its outcome only as far as needed:
all of them when the response cache stores the answer, else up to the first that names
the response id. The outcome is the same either way: the spend row's response id, usage
and cost, and (with the cache) the answer replayed to the next identical request.

Over real HTTP, the raw chat path (``providers/rawsse.py``: events kept as wire bytes),
against the scripted upstream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway, spend_rows, streamed
from triogate.api import flow as flow_module

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.scripted_upstream import Scripted
    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

BASE = {"object": "chat.completion.chunk", "created": 1700000000, "model": "gpt-up-a"}


def _chunk(fields: dict[str, Any], delta: dict[str, Any], finish: str | None = None
           ) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({**BASE, **fields, "choices": [choice]}) + b"\n\n"


ID = {"id": "chatcmpl-named"}
USAGE = b"data: " + orjson.dumps({**BASE, **ID, "choices": [], "usage": {
    "prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}) + b"\n\n"
# The first chunk names no id (as no real upstream writes it): the id is the second's.
EVENTS = [_chunk({}, {"role": "assistant", "content": ""}), _chunk(ID, {"content": "Once"}),
          _chunk(ID, {"content": " upon"}), _chunk(ID, {}, "stop"), USAGE,
          b"data: [DONE]\n\n"]
BODY = {"model": "gpt-test", "stream": True, "max_tokens": 50,
        "messages": [{"role": "user", "content": "a story"}]}



@pytest.mark.parametrize("cache", [False, True])
async def test_the_outcome_of_a_stream_is_the_same_with_or_without_a_cache(
    tmp_path: Path, redis: RespBackend, redis_url: str, scripted: Scripted, cache: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted.pieces = EVENTS
    decoded: list[int] = []  # how many kept events each decode call was given
    decode = flow_module._decoded

    def counting(kept: list[Any]) -> list[dict[str, Any]]:
        decoded.append(len(kept))
        return decode(kept)

    monkeypatch.setattr(flow_module, "_decoded", counting)
    overrides: dict[str, Any] = (
        {"litellm_settings": {"cache": True, "cache_params": {"ttl": 60}}} if cache else {})
    config = gateway_config(tmp_path / "state", redis_url, f"http://127.0.0.1:{scripted.port}",
                            **overrides)
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            url = f"{gateway.openai_base}/chat/completions"
            first = await streamed(url, BODY)
            assert first.startswith(b"".join(EVENTS[:4]))  # the upstream's own bytes
            # no-cache and no-store: from the upstream, and nothing kept even with a cache
            # (its events are decoded only up to the id).
            await streamed(url, {**BODY, "cache": {"no-cache": True, "no-store": True}})
            again = await streamed(url, BODY)
            rows = await spend_rows(gateway, 3)
    upstream_rows = [row for row in rows if not row.cache_hit]
    assert [row.response_id for row in upstream_rows] == ["chatcmpl-named"] * len(upstream_rows)
    for row in upstream_rows:
        assert (row.status, row.input_tokens, row.output_tokens) == ("success", 9, 3)
        assert row.cost_nanousd > 0
    # Kept: 4 chunks and the usage chunk. Without a store, up to the one naming the id.
    assert sum(decoded) == (5 + 2 if cache else 3 * 2)
    if cache:  # the third was answered from the first's stored answer
        newest = rows[0]
        assert newest.cache_hit and newest.output_tokens == 3 and newest.response_id is None
        assert b"Once" in again and b" upon" in again
        assert len(upstream_rows) == 2
    else:
        assert again == first
        assert len(upstream_rows) == 3
