"""An upstream that goes silent mid-stream longer than the stream timeout fails the stream
the same way on every path, over real HTTP: the events it sent reach the client, then one
timeout error event (the status line is long gone), no end marker; the upstream
connection is dropped; the request is settled once, as an error, charged for what was
produced.

Each body read's timeout is kept by one watchdog per run (``providers/watchdog.py``), not
a deadline scope per read: these tests pin the behaviour the scope had (the expected bytes
are what the gateway sent before the watchdog). Both paths are covered: the raw one
(``providers/rawsse.py``, the upstream's own bytes) and the general one (SSE parse,
translate, encode; ``ChatPassthrough``/``Passthrough`` switched off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import MASTER_HEADERS, gateway_config, running_gateway, spend_rows
from triogate.providers import upstream as upstream_module

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from tests.e2e.scripted_upstream import Scripted
    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

#: The stream timeout of every deployment (router_settings.timeout): how long one wait
#: on the upstream may last.
TIMEOUT_S = 0.5

_CHAT_BASE = {"id": "chatcmpl-quiet", "object": "chat.completion.chunk",
              "created": 1700000000, "model": "gpt-up-a"}
CHAT_EVENTS = [b"data: " + orjson.dumps({**_CHAT_BASE, "choices": [
    {"index": 0, "delta": {"content": text}, "finish_reason": None}]}) + b"\n\n"
    for text in ("Once", " upon", " a time")]
CHAT_ERROR = (b'data: {"error":{"message":"the upstream model did not answer in time",'
              b'"type":"timeout","param":null,"code":null}}\n\n')


def _messages_event(kind: str, **fields: Any) -> bytes:
    return (b"event: " + kind.encode() + b"\ndata: "
            + orjson.dumps({"type": kind, **fields}) + b"\n\n")


MESSAGES_EVENTS = [
    _messages_event("message_start", message={
        "id": "msg_quiet", "type": "message", "role": "assistant", "model": "claude-up",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 9, "output_tokens": 1}}),
    _messages_event("content_block_start", index=0,
                    content_block={"type": "text", "text": ""}),
    *[_messages_event("content_block_delta", index=0,
                      delta={"type": "text_delta", "text": text})
      for text in ("Once", " upon", " a time")],
]
MESSAGES_ERROR = (b'event: error\ndata: {"type":"error","error":{"type":"timeout",'
                  b'"message":"the upstream model did not answer in time"}}\n\n')

CASES = {
    "chat": ("/v1/chat/completions", "gpt-test", "ChatPassthrough", CHAT_EVENTS, CHAT_ERROR),
    "messages": ("/v1/messages", "claude-test", "Passthrough", MESSAGES_EVENTS,
                 MESSAGES_ERROR),
}


class _Never:
    """Stands in for the pass-through translator in ``providers/upstream.py``: the raw
    path is off."""


@pytest.fixture
async def gateway(tmp_path: Path, redis: RespBackend, redis_url: str,
                  scripted: Scripted) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, f"http://127.0.0.1:{scripted.port}",
                            router_settings={"timeout": TIMEOUT_S})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


async def _quiet_stream(gateway: Gateway, api: str) -> tuple[bytes, float]:
    """The client's bytes, and how long after the last upstream event the error came."""
    path, model, _, events, _ = CASES[api]
    body = {"model": model, "stream": True, "max_tokens": 50,
            "messages": [{"role": "user", "content": "a story"}]}
    seen = b""
    last_event_at = 0.0
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=20) as http, http.stream(
            "POST", f"{gateway.url}{path}", json=body, headers=MASTER_HEADERS,
        ) as response:
            assert response.status_code == 200
            async for part in response.aiter_raw():
                seen += part
                if seen.count(b"\n\n") == len(events) and not last_event_at:
                    last_event_at = trio.current_time()
    return seen, trio.current_time() - last_event_at


@pytest.mark.parametrize("api", ["chat", "messages"])
async def test_a_silent_upstream_mid_stream_times_out_the_same_way(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    _, _, translator, events, error = CASES[api]
    scripted.pieces = events
    scripted.hang = True  # then silent until the gateway goes away
    for raw in (False, True):
        with monkeypatch.context() as patch:
            if not raw:
                patch.setattr(upstream_module, translator, _Never)
            seen, quiet_s = await _quiet_stream(gateway, api)
        assert seen == b"".join(events) + error
        # The wait began when the last event was read (before the client had it): the
        # error follows within the timeout plus scheduling slack, not before it.
        assert TIMEOUT_S - 0.1 <= quiet_s < TIMEOUT_S + 2.0
        with trio.fail_after(5):
            while scripted.gone < (2 if raw else 1):  # the upstream connection dropped
                await trio.sleep(0.01)
    # settled once each, no retry after the first event
    new, old = await spend_rows(gateway, 2)  # newest first
    assert new.status == old.status == "error"
    assert new.http_status == old.http_status == 200  # what the client got: a 200 stream
    assert new.output_tokens == old.output_tokens > 0  # counted so far
    assert new.input_tokens == old.input_tokens > 0
    assert new.cost_nanousd == old.cost_nanousd > 0
    assert new.response_id == old.response_id is None  # only a finished stream names it
