"""Server-sent events: an incremental parser, and upstream events read from a response.

:class:`SSEDecoder` turns raw bytes into events (WHATWG rules); :class:`SSESource` reads an
httpx streaming response through it and hands out each event's JSON object, the
:class:`~triogate.providers.streaming.EventSource` of an HTTP upstream.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from triogate.errors import ProviderProtocolError
from triogate.providers.http import map_exceptions
from triogate.providers.http1 import DEFAULT_MAX_EVENT_BYTES
from triogate.providers.transport import body_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import httpx


def body_reader(response: httpx.Response) -> Callable[[], Awaitable[bytes]]:
    """``read()``: the next bytes of ``response``'s body, b"" at its end (a checkpoint).

    The gateway's own transport's body is read directly (``UpstreamBody.read_some``:
    bounded by the stream's time, not by the whole-body bound); any other (a test's
    ``MockTransport``) through httpx's decoded iterator.
    """
    coding = response.headers.get("content-encoding", "identity").strip().lower()
    body = body_of(response) if coding in ("", "identity") else None
    if body is not None:
        return body.read_some
    chunks = response.aiter_bytes()

    async def read() -> bytes:
        try:
            return await chunks.__anext__()
        except StopAsyncIteration:
            await trio.lowlevel.checkpoint()
            return b""

    return read


@attrs.frozen(kw_only=True)
class ServerSentEvent:
    """One dispatched SSE event (``event`` defaults to "message", as the spec says)."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry_ms: int | None = None


class SSEDecoder:
    """Incremental SSE parser over raw bytes (WHATWG "server-sent events" rules).

    Lines end in LF, CRLF or CR, even when a CRLF is split across two chunks. Lines
    starting with ``:`` are comments. Several ``data:`` lines join with LF. An event is
    dispatched at a blank line; at end of input a pending event is dispatched too (the
    spec drops it, but an upstream that forgets the last blank line still meant it).

    Linear in its input: a line that does not end yet is not scanned again when more of
    it comes. One event (its unfinished line and the data lines before it) may take
    ``max_event_bytes`` at most; past that :meth:`feed` raises ``ProviderProtocolError``.
    """

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._held = 0  # bytes of the event's data lines so far
        self._buffer = bytearray()
        self._skip_lf = False  # the previous chunk ended in CR: a leading LF belongs to it
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Parse ``chunk``; return the events it completed (often none, sometimes many)."""
        if not chunk:
            return []  # and keep _skip_lf for the chunk that brings the LF
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        buffer = self._buffer
        if b"\r" not in chunk and b"\n" not in chunk:  # the line goes on: no rescan
            buffer += chunk
            self._check(len(buffer))
            return []
        scanned = len(buffer)  # the unfinished line held no line end
        buffer += chunk
        events: list[ServerSentEvent] = []
        start = 0
        while True:
            cr = buffer.find(b"\r", max(start, scanned))
            lf = buffer.find(b"\n", max(start, scanned))
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                end, after = cr, cr + 1
                if after < len(buffer) and buffer[after] == 0x0A:
                    after += 1
                elif after == len(buffer):
                    self._skip_lf = True
            else:
                end, after = lf, lf + 1
            self._check(end - start)
            event = self._line(bytes(buffer[start:end]).decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
            start = after
        del buffer[:start]
        self._check(len(buffer))
        return events

    def _check(self, pending: int) -> None:
        """Refuse an event that grew past the bound (its data lines and ``pending``
        bytes of a line not yet taken)."""
        if self._held + pending > self._max:
            self._buffer.clear()  # the bytes go now, whatever keeps the decoder
            self._data, self._held = [], 0
            raise ProviderProtocolError(
                f"upstream stream event larger than {self._max} bytes")

    def close(self) -> list[ServerSentEvent]:
        """End of input: the last unterminated line and event, if any."""
        events: list[ServerSentEvent] = []
        if self._buffer:
            event = self._line(bytes(self._buffer).decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
            self._buffer.clear()
        event = self._line("")
        if event is not None:
            events.append(event)
        return events

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            self._data.append(value)
            self._held += len(value) + 1
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "retry" and value.isdigit():
            self._retry_ms = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        self._held = 0
        if not self._data:
            self._event = ""
            return None
        event = ServerSentEvent(
            event=self._event or "message",
            data="\n".join(self._data),
            id=self._id,
            retry_ms=self._retry_ms,
        )
        self._event, self._data = "", []
        return event


class SSESource:
    """Upstream events decoded from an httpx streaming response.

    ``data: [DONE]`` (OpenAI) ends the stream; so does the end of the body.
    """

    def __init__(self, response: httpx.Response,
                 max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._read = body_reader(response)
        self._decoder = SSEDecoder(max_event_bytes)
        self._pending: collections.deque[ServerSentEvent] = collections.deque()
        self._ended = False

    async def next_event(self) -> dict[str, Any] | None:
        """The next event's JSON (a checkpoint: the read, or a yield for a buffered event).

        Raises:
            ProviderTimeout: no chunk within the stream timeout.
            ProviderConnectError: the connection broke mid-stream.
            ProviderProtocolError: an event's data is not a JSON object.
        """
        if self._pending:
            await trio.lowlevel.checkpoint()  # no read below: yield here
        while not self._pending:
            if self._ended:
                await trio.lowlevel.checkpoint()
                return None
            with map_exceptions():
                chunk = await self._read()
            if not chunk:
                self._ended = True
                self._pending.extend(self._decoder.close())
                continue
            self._pending.extend(self._decoder.feed(chunk))
        sse = self._pending.popleft()
        if sse.data.strip() == "[DONE]":
            self._ended = True
            self._pending.clear()
            return None
        try:
            value = orjson.loads(sse.data)
        except orjson.JSONDecodeError as exc:
            raise ProviderProtocolError(
                f"upstream stream event is not JSON: {sse.data[:200]!r}"
            ) from exc
        if not isinstance(value, dict):
            raise ProviderProtocolError(
                f"upstream stream event is not an object: {sse.data[:200]!r}"
            )
        return value

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if the last read already brought it (an upstream that sent
        several at once, or a gateway that fell behind); None when a read is needed, at
        [DONE], or for data that is not a JSON object (``next_event`` raises for it)."""
        if not self._pending:
            return None
        try:
            value = orjson.loads(self._pending[0].data)
        except orjson.JSONDecodeError:
            return None  # [DONE] or bad data: left for next_event
        if not isinstance(value, dict):
            return None
        self._pending.popleft()
        return value
