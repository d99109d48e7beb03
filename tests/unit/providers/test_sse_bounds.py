"""Stream parsing stays linear in its input and bounds one event's size, on both paths:
the SSE decoder (the general path) and the raw stream (the client speaks the upstream's
API)."""

from __future__ import annotations

import time

import pytest
import trio

from triogate.errors import ProviderProtocolError
from triogate.providers.rawsse import CHAT, MESSAGES, RawStream
from triogate.providers.sse import SSEDecoder
from triogate.providers.streaming import Passthrough
from triogate.providers.usage import ChatUsageTracker

MiB = 1024 * 1024
PIECE = b"x" * 4096


def test_a_long_line_in_small_pieces_is_linear() -> None:
    """16 MiB of one line in 4 KiB pieces: one pass (a rescan per piece would read
    32 GiB), then the event still decodes whole."""
    decoder = SSEDecoder(max_event_bytes=64 * MiB)
    started = time.process_time()
    assert decoder.feed(b"data: ") == []
    for _ in range(16 * MiB // len(PIECE)):
        assert decoder.feed(PIECE) == []
    events = decoder.feed(b"\n\n")
    assert time.process_time() - started < 2
    assert len(events) == 1 and len(events[0].data) == 16 * MiB


@pytest.mark.parametrize("tail", [b"", b"\n"])
def test_an_event_past_the_bound_is_refused(tail: bytes) -> None:
    """One line past the bound, or many data lines that add up past it."""
    decoder = SSEDecoder(max_event_bytes=64 * 1024)
    with pytest.raises(ProviderProtocolError, match="larger than 65536 bytes"):
        for _ in range(100):
            decoder.feed(b"data: " + PIECE[:1000] + tail)


def test_events_under_the_bound_pass_any_number() -> None:
    decoder = SSEDecoder(max_event_bytes=64 * 1024)
    for _ in range(1000):
        assert len(decoder.feed(b"data: " + PIECE + b"\n\n")) == 1


def _raw(pieces: list[bytes], framing: object, max_event: int) -> RawStream:
    queue = list(pieces)

    async def read() -> bytes:
        await trio.lowlevel.checkpoint()
        return queue.pop(0) if queue else b""

    return RawStream(read, ChatUsageTracker(input_tokens=1), Passthrough(),
                     framing, max_event)  # type: ignore[arg-type]


@pytest.mark.parametrize("framing", [CHAT, MESSAGES])
async def test_a_raw_stream_line_without_end_is_bounded_and_linear(framing: object) -> None:
    pieces = [b'data: {"choices": "'] + [PIECE] * (8 * MiB // len(PIECE))
    stream = _raw(pieces, framing, 1 * MiB)
    started = time.process_time()
    with pytest.raises(ProviderProtocolError, match="larger than"):
        async for _ in stream:
            pass
    assert time.process_time() - started < 1


async def test_a_raw_stream_event_in_many_pieces_is_whole() -> None:
    """An event cut into 4 KiB pieces under a large bound: kept, joined once, passed on
    with its bytes as the upstream sent them."""
    content = "y" * (2 * MiB)
    event = b'data: {"choices":[{"index":0,"delta":{"content":"' + content.encode() + (
        b'"},"finish_reason":"stop"}]}\n\n')
    pieces = [event[i:i + 4096] for i in range(0, len(event), 4096)] + [b"data: [DONE]\n\n"]
    stream = _raw(pieces, CHAT, 4 * MiB)
    started = time.process_time()
    got = [e async for e in stream]
    assert time.process_time() - started < 1
    assert got[0]["choices"][0]["delta"]["content"] == content


async def test_a_decoded_body_of_another_transport_is_bounded() -> None:
    """A client on another transport (httpx decodes its gzip): the decoded body is
    bounded by the default body bound all the same, read a piece at a time."""
    import gzip

    import httpx

    from triogate.providers.http import post_json
    from triogate.providers.http1 import DEFAULT_MAX_BODY_BYTES

    bomb = gzip.compress(b" " * (DEFAULT_MAX_BODY_BYTES + MiB), 9)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=bomb, headers={"content-encoding": "gzip"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ProviderProtocolError, match="larger than"):
            await post_json(client, "http://upstream.test/v1/chat/completions", headers={},
                            body={"model": "m"}, timeout_s=10)
