"""A finished stream's outcome without keeping its events: each upstream event is parsed
once (by the stream), folded into the answer as it passes when the response cache stores
it, and only the first event that names the response id is kept. The outcome is what it
was when every event was kept and parsed again at the end: the spend row's response id,
usage and cost, and (with the cache) the answer stored, byte for byte the batch
assembly's, replayed to the next identical stream and served whole to a non-streaming one.

Over real HTTP, the raw chat path (``providers/rawsse.py``), against the scripted upstream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import (
    MASTER_HEADERS,
    gateway_config,
    running_gateway,
    spend_rows,
    streamed,
)
from tests.unit.cache import assemble_before

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
BODY: dict[str, Any] = {"model": "gpt-test", "stream": True, "max_tokens": 50,
        "messages": [{"role": "user", "content": "a story"}]}



def _parses(monkeypatch: pytest.MonkeyPatch, needle: bytes) -> list[int]:
    """Counts the JSON parses (anywhere: ``orjson.loads``) of data holding ``needle``."""
    seen: list[int] = []
    loads = orjson.loads

    def counting(data: Any) -> Any:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if needle in raw:
            seen.append(1)
        return loads(data)

    monkeypatch.setattr(orjson, "loads", counting)
    return seen


def _reference(pieces: list[bytes]) -> dict[str, Any] | None:
    """The batch assembly (as it was before the incremental one) of ``pieces``' events."""
    events = [orjson.loads(piece[len(b"data: "):]) for piece in pieces
              if piece != b"data: [DONE]\n\n"]
    return assemble_before.assemble("chat", events)


@pytest.mark.parametrize("cache", [False, True])
async def test_the_outcome_of_a_stream_is_the_same_with_or_without_a_cache(
    tmp_path: Path, redis: RespBackend, redis_url: str, scripted: Scripted, cache: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted.pieces = EVENTS
    # The chunk '"content":"Once"': in the stored answer it is "Once upon".
    parsed = _parses(monkeypatch, b'"Once"')
    overrides: dict[str, Any] = (
        {"litellm_settings": {"cache": True, "cache_params": {"ttl": 60}}} if cache else {})
    config = gateway_config(tmp_path / "state", redis_url, f"http://127.0.0.1:{scripted.port}",
                            **overrides)
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            url = f"{gateway.openai_base}/chat/completions"
            first = await streamed(url, BODY)
            assert first.startswith(b"".join(EVENTS[:4]))  # the upstream's own bytes
            # no-cache and no-store: from the upstream, and not stored even with a cache.
            await streamed(url, {**BODY, "cache": {"no-cache": True, "no-store": True}})
            again = await streamed(url, BODY)
            whole = None
            if cache:  # the stored answer, as a non-streaming client gets it
                async with httpx.AsyncClient(timeout=20) as http:
                    response = await http.post(url, json={**BODY, "stream": False},
                                               headers=MASTER_HEADERS)
                assert response.status_code == 200, response.text
                whole = response.content
            rows = await spend_rows(gateway, 4 if cache else 3)
    upstream_rows = [row for row in rows if not row.cache_hit]
    assert [row.response_id for row in upstream_rows] == ["chatcmpl-named"] * len(upstream_rows)
    for row in upstream_rows:
        assert (row.status, row.input_tokens, row.output_tokens) == ("success", 9, 3)
        assert row.cost_nanousd > 0
    # Each upstream stream parsed its chunk once; nothing parsed it again for the outcome.
    assert len(parsed) == len(upstream_rows)
    if cache:  # the third and fourth were answered from the first's stored answer
        assert [row.cache_hit for row in rows] == [True, True, False, False]
        assert all(row.output_tokens == 3 and row.response_id is None for row in rows[:2])
        assert b"Once" in again and b" upon" in again
        assert whole == orjson.dumps(_reference(EVENTS))
        assert len(upstream_rows) == 2
    else:
        assert again == first
        assert len(upstream_rows) == 3


# A stream that ends well but is no answer: its first chunk finishes the choice (alone it
# would assemble), then a chunk of another kind. Nothing may be stored.
NOT_AN_ANSWER = [_chunk(ID, {"role": "assistant", "content": "Once"}, "stop"),
                 b"data: " + orjson.dumps({**ID, "object": "chat.completion.note",
                                           "choices": []}) + b"\n\n",
                 USAGE, b"data: [DONE]\n\n"]


async def test_a_stream_that_is_no_answer_is_not_stored(
    tmp_path: Path, redis: RespBackend, redis_url: str, scripted: Scripted,
) -> None:
    assert _reference(NOT_AN_ANSWER) is None
    assert _reference(NOT_AN_ANSWER[:1]) is not None
    scripted.pieces = NOT_AN_ANSWER
    config = gateway_config(tmp_path / "state", redis_url, f"http://127.0.0.1:{scripted.port}",
                            litellm_settings={"cache": True, "cache_params": {"ttl": 60}})
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            url = f"{gateway.openai_base}/chat/completions"
            first = await streamed(url, BODY)
            again = await streamed(url, BODY)
            rows = await spend_rows(gateway, 2)
    assert first == again and first.startswith(b"".join(NOT_AN_ANSWER[:2]))
    assert [(row.cache_hit, row.status, row.response_id) for row in rows] == [
        (False, "success", "chatcmpl-named")] * 2
