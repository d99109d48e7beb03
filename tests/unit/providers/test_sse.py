"""The SSE decoder: fields, multi-line data, comments, line endings, chunk boundaries."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from triogate.errors import ProviderProtocolError
from triogate.providers.sse import ServerSentEvent, SSEDecoder, SSESource
from triogate.providers.streaming import Passthrough, TranslatedStream
from triogate.providers.usage import ChatUsageTracker

if TYPE_CHECKING:
    from collections.abc import Mapping


def decode(*chunks: bytes) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events = [e for chunk in chunks for e in decoder.feed(chunk)]
    return events + decoder.close()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"data: hi\n\n", [ServerSentEvent(data="hi")]),
        (b"data:hi\n\n", [ServerSentEvent(data="hi")]),  # the space is optional
        (b"data:  two spaces\n\n", [ServerSentEvent(data=" two spaces")]),  # only one is stripped
        (b"event: ping\ndata: {}\n\n", [ServerSentEvent(event="ping", data="{}")]),
        (b"data: a\ndata: b\n\n", [ServerSentEvent(data="a\nb")]),
        (b"data\n\n", [ServerSentEvent(data="")]),  # a field name alone: empty value
        (b": a comment\ndata: x\n\n", [ServerSentEvent(data="x")]),
        (b":keep-alive\n\n", []),  # comment only: nothing dispatched
        (b"event: ping\n\n", []),  # no data: nothing dispatched, and the event name resets
        (b"event: ping\n\ndata: x\n\n", [ServerSentEvent(data="x")]),
        (b"data: a\r\n\r\ndata: b\r\r", [ServerSentEvent(data="a"), ServerSentEvent(data="b")]),
        (b"id: 7\nretry: 1500\ndata: x\n\n", [ServerSentEvent(data="x", id="7", retry_ms=1500)]),
        (b"retry: soon\ndata: x\n\n", [ServerSentEvent(data="x")]),  # non-numeric retry ignored
        (b"unknown: field\ndata: x\n\n", [ServerSentEvent(data="x")]),
        (b"data: [DONE]\n\n", [ServerSentEvent(data="[DONE]")]),
        (b"data: last without blank line", [ServerSentEvent(data="last without blank line")]),
        (b"data: \xc3\xa9t\xc3\xa9\n\n", [ServerSentEvent(data="\u00e9t\u00e9")]),
    ],
)
def test_decoder_table(raw: bytes, expected: list[ServerSentEvent]) -> None:
    assert decode(raw) == expected


def test_crlf_split_across_chunks_is_one_line_ending() -> None:
    # A CR at the end of one chunk and LF at the start of the next must not make an
    # extra blank line (which would dispatch "a" early and lose nothing, but would
    # split "data: a\r" + "\ndata: b" into two events instead of one).
    assert decode(b"data: a\r", b"\ndata: b\r\n\r\n") == [ServerSentEvent(data="a\nb")]


def test_an_empty_chunk_between_cr_and_lf_changes_nothing() -> None:
    assert decode(b"data: a\r", b"", b"\n\n") == [ServerSentEvent(data="a")]


def test_multibyte_character_split_across_chunks() -> None:
    raw = "data: caf\u00e9\n\n".encode()
    cut = raw.index(b"\xc3") + 1
    assert decode(raw[:cut], raw[cut:]) == [ServerSentEvent(data="caf\u00e9")]


def test_feed_returns_events_as_soon_as_complete() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.feed(b"\ndata: b") == [ServerSentEvent(data="a")]
    assert decoder.feed(b"\n\n") == [ServerSentEvent(data="b")]
    assert decoder.close() == []


STREAM = (
    b'event: message_start\r\ndata: {"a": 1}\r\n\r\n'
    b": comment\n"
    b"data: line1\ndata: line2\n\n"
    b"event: x\rdata: cr-only\r\r"
    b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode(*chunks) == decode(STREAM)
    assert [e.data for e in decode(STREAM)] == ['{"a": 1}', "line1\nline2", "cr-only", "[DONE]"]
    assert [e.event for e in decode(STREAM)] == ["message_start", "message", "x", "message"]


# --------------------------------------------------------------------------- bursts


def _source(body: bytes) -> SSESource:
    return SSESource(httpx.Response(200, content=body))


async def test_a_burst_from_one_read_is_handed_out_without_reading() -> None:
    body = b"".join(b'data: {"n": %d}\n\n' % i for i in range(3)) + b"data: [DONE]\n\n"
    source = _source(body)
    assert source.next_nowait() is None  # nothing read yet
    assert await source.next_event() == {"n": 0}  # one read brings all four events
    assert [source.next_nowait(), source.next_nowait()] == [{"n": 1}, {"n": 2}]
    assert source.next_nowait() is None  # [DONE] is next_event's to end the stream
    assert await source.next_event() is None


async def test_bad_data_in_a_burst_is_left_for_next_event_to_raise() -> None:
    source = _source(b'data: {"n": 0}\n\ndata: [1]\n\ndata: {"n": 2}\n\n')
    assert await source.next_event() == {"n": 0}
    assert source.next_nowait() is None
    with pytest.raises(ProviderProtocolError, match="not an object"):
        await source.next_event()


class _Picky(Passthrough):
    """A translator that cannot read an event without ``n`` (a shape error)."""

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [{"n": event["n"]}]


async def test_a_translated_burst_defers_a_shape_error_to_the_next_read() -> None:
    body = b'data: {"n": 0}\n\ndata: {"n": 1}\n\ndata: {"m": 2}\n\ndata: {"n": 3}\n\n'
    stream = TranslatedStream(_source(body), ChatUsageTracker(input_tokens=1), _Picky())
    assert await stream.__anext__() == {"n": 0}
    assert stream.next_nowait() == {"n": 1}
    assert stream.next_nowait() is None  # the bad event is consumed, its error kept
    with pytest.raises(ProviderProtocolError, match="unexpected shape"):
        await stream.__anext__()
