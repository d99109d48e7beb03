"""An Anthropic stream for a ``/v1/messages`` client forwards the upstream's own event
bytes (``providers/rawsse.py``, the messages framing): the client gets what the general
path (parse, ``Passthrough``, ``api/sse.encode``) sent before, byte for byte, and usage
is counted and the response cached the same.

As ``test_raw_chat_stream.py``: each scenario runs through one gateway over real HTTP
against a scripted upstream on loopback, once on the raw path and once with it switched
off, and the two client byte streams compare equal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import (
    MASTER_HEADERS,
    MASTER_KEY,
    gateway_config,
    leave_mid_stream,
    running_gateway,
    spend_rows,
)
from triogate.providers import upstream as upstream_module
from triogate.providers.rawsse import RawStream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from tests.e2e.scripted_upstream import Scripted
    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def event(kind: str, **fields: Any) -> bytes:
    return (b"event: " + kind.encode() + b"\ndata: "
            + orjson.dumps({"type": kind, **fields}) + b"\n\n")


START = event("message_start", message={
    "id": "msg_raw1", "type": "message", "role": "assistant", "model": "claude-up",
    "content": [], "stop_reason": None, "stop_sequence": None,
    "usage": {"input_tokens": 9, "output_tokens": 1}})
BLOCK = event("content_block_start", index=0, content_block={"type": "text", "text": ""})
PING = event("ping")
TEXTS = ("Once", " upon a time", ", \u00e9l\u00e8ve \u2603", ' "quoted"\n', " \\ end")
DELTAS = [event("content_block_delta", index=0, delta={"type": "text_delta", "text": t})
          for t in TEXTS]
BLOCK_STOP = event("content_block_stop", index=0)
MESSAGE_DELTA = event("message_delta", delta={"stop_reason": "end_turn",
                                              "stop_sequence": None},
                      usage={"output_tokens": 7})
STOP = event("message_stop")
EVENTS = [START, BLOCK, PING, *DELTAS[:2], PING, *DELTAS[2:], BLOCK_STOP, MESSAGE_DELTA,
          STOP]
REALISTIC = b"".join(EVENTS)


@pytest.fixture
async def gateway(tmp_path: Path, redis: RespBackend, redis_url: str,
                  scripted: Scripted) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, f"http://127.0.0.1:{scripted.port}",
                            litellm_settings={"cache": True, "cache_params": {"ttl": 60}})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


class _Never:
    """Stands in for Passthrough in ``providers/upstream.py``: the raw path is off."""


def _body(content: str) -> dict[str, Any]:
    return {"model": "claude-test", "stream": True, "max_tokens": 50,
            "messages": [{"role": "user", "content": content}]}


async def _stream(gateway: Gateway, *, raw: bool, monkeypatch: pytest.MonkeyPatch,
                  content: str = "a story") -> tuple[bytes, httpx.Headers]:
    opened: list[RawStream] = []

    class Seen(RawStream):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            opened.append(self)

    with monkeypatch.context() as patch:
        patch.setattr(upstream_module, "RawStream", Seen)
        if not raw:
            patch.setattr(upstream_module, "Passthrough", _Never)
        with trio.fail_after(20):
            async with httpx.AsyncClient(timeout=20) as http, http.stream(
                "POST", f"{gateway.url}/v1/messages", json=_body(f"{content} {raw}"),
                headers=MASTER_HEADERS,
            ) as response:
                assert response.status_code == 200
                data = b"".join([part async for part in response.aiter_raw()])
    cached = response.headers["x-triogate-cache"] == "hit"
    assert len(opened) == (raw and not cached)  # the path under test was taken
    return data, response.headers


async def _both(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, bytes]:
    old, _ = await _stream(gateway, raw=False, monkeypatch=monkeypatch)
    new, _ = await _stream(gateway, raw=True, monkeypatch=monkeypatch)
    return old, new



def _splits(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("cut", ["events", "bytes_7", "one_read"])
async def test_raw_output_is_the_encoded_output(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    scripted.pieces = {"events": EVENTS, "bytes_7": _splits(REALISTIC, 7),
                       "one_read": [REALISTIC]}[cut]
    scripted.gap_s = 0.002
    old, new = await _both(gateway, monkeypatch)
    assert new == old == REALISTIC  # compact JSON, names as types: the upstream's bytes
    new_row, old_row = await spend_rows(gateway, 2)  # newest first
    assert new_row.status == old_row.status == "success"
    assert (new_row.input_tokens, new_row.output_tokens) == (9, 7)
    assert (old_row.input_tokens, old_row.output_tokens) == (9, 7)
    assert new_row.cost_nanousd == old_row.cost_nanousd > 0


async def test_a_raw_stream_is_cached_as_the_encoded_one(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events kept as wire bytes are decoded for the cache as before."""
    scripted.pieces = [REALISTIC]
    hits = []
    for raw in (False, True):
        first, headers = await _stream(gateway, raw=raw, monkeypatch=monkeypatch,
                                       content="cache me")
        assert first == REALISTIC and headers["x-triogate-cache"] == "miss"
        await spend_rows(gateway, 3 if raw else 1)  # the cache SET is in
        hit, headers = await _stream(gateway, raw=raw, monkeypatch=monkeypatch,
                                     content="cache me")
        assert headers["x-triogate-cache"] == "hit"
        hits.append(hit)
    assert hits[0] == hits[1]
    assert b"".join(orjson.loads(e.split(b"\ndata: ")[1])["delta"].get("text", "").encode()
                    for e in hits[1].split(b"\n\n")[:-1]
                    if e.startswith(b"event: content_block_delta")) == "".join(TEXTS).encode()


@pytest.mark.parametrize("error", [
    event("error", error={"type": "overloaded_error", "message": "Overloaded"}),
    b"event: content_block_delta\ndata: {not json\n\n",
    b'event: content_block_delta\ndata: ["a list"]\n\n',
])
async def test_an_upstream_error_mid_stream_ends_it_the_same_way(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch, error: bytes
) -> None:
    scripted.pieces = [*EVENTS[:5], error, *EVENTS[5:]]
    # One event per read: the old path dropped events that came in the same read as an
    # error event (its burst loop raised before writing them); the raw path sends them.
    scripted.gap_s = 0.05
    old, new = await _both(gateway, monkeypatch)
    assert new == old
    assert new.startswith(b"".join(EVENTS[:5]))
    assert new.split(b"\n\n")[-2].startswith(b"event: error\ndata: ")
    assert STOP not in new


async def test_other_sse_forms_and_crlf_are_parsed_as_before(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    spaced = b'{"type": "ping"}'
    scripted.pieces = [
        b": keep-alive\n\n" + START,
        b"id: 7\n" + BLOCK,  # a field before the event line
        b"event: ping\ndata: " + spaced + b"\n\n",  # not compact (as Anthropic's)
        b"data: " + DELTAS[0].split(b"\ndata: ")[1],  # no event line
        b"event: delta\n" + DELTAS[1].split(b"\n", 1)[1],  # a name that is not the type
        b'event: content_block_delta\ndata: {"type": "content_block_delta",\ndata: '
        + DELTAS[2].split(b"\ndata: {")[1],  # two data lines
        b"\n\n\n" + DELTAS[3],
        (DELTAS[4] + BLOCK_STOP + MESSAGE_DELTA).replace(b"\n", b"\r\n"),  # CR LF on
        STOP.replace(b"\n", b"\r\n"),
    ]
    old, new = await _both(gateway, monkeypatch)
    # The one difference: JSON that is not compact goes on as the upstream wrote it (the
    # same JSON), where the old path wrote it compact.
    assert new == old.replace(PING, b"event: ping\ndata: " + spaced + b"\n\n")
    assert old.count(b"event: ") == len(EVENTS) - 1  # one ping less
    assert old.startswith(START + BLOCK + PING + DELTAS[0] + DELTAS[1])


async def test_a_client_gone_mid_stream_is_charged_the_same(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.pieces = EVENTS[:6]
    scripted.hang = True
    for raw in (False, True):
        with monkeypatch.context() as patch:
            if not raw:
                patch.setattr(upstream_module, "Passthrough", _Never)
            # every event the upstream sent arrived: go away
            seen = await leave_mid_stream(f"{gateway.url}/v1/messages", _body("a story"), 6)
            assert seen == b"".join(EVENTS[:6])
            with trio.fail_after(20):
                while scripted.gone < (2 if raw else 1):  # the upstream stream was dropped
                    await trio.sleep(0.01)
    new, old = await spend_rows(gateway, 2)  # newest first
    assert new.status == old.status == "cancelled"
    assert new.output_tokens == old.output_tokens > 0
    assert new.input_tokens == old.input_tokens == 9
    assert new.cost_nanousd == old.cost_nanousd > 0


async def test_the_anthropic_sdk_reads_a_raw_stream(
    gateway: Gateway, scripted: Scripted
) -> None:
    scripted.pieces = _splits(REALISTIC, 7)
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=MASTER_KEY,
                                      max_retries=0)
    with trio.fail_after(20):
        async with client.messages.stream(
            model="claude-test", max_tokens=50,
            messages=[{"role": "user", "content": "Stream to me"}]) as stream:
            types = [item.type async for item in stream]
            final = await stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert types.count("ping") == 0 or "ping" in types  # the SDK may hide pings
    assert final.content[0].type == "text" and final.content[0].text == "".join(TEXTS)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 7)
    assert final.stop_reason == "end_turn"
    (row,) = await spend_rows(gateway, 1)
    assert (row.status, row.input_tokens, row.output_tokens) == ("success", 9, 7)
