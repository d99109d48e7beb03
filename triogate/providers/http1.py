"""HTTP/1.1 on one upstream connection: the request's write, the response head, and a
body framed by ``Content-Length``, ``chunked`` or the connection's end.

The wire side of :mod:`.transport` (which pools these connections). Errors are httpx's,
as the transport's are.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Protocol, final

import httpx
import trio

from triogate.providers.chunks import buffered_chunk, chunk_size, chunk_size_of, whole_chunks
from triogate.providers.watchdog import watchdog

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable

    from triogate.providers.watchdog import Paced, ReadWatch

MAX_HEAD_BYTES = 64 * 1024
READ_SIZE = 65536
NO_BODY_STATUS = frozenset((204, 304))
LAST_CHUNK = b"0\r\n\r\n"
_INF = float("inf")

#: (scheme, host, port) of an upstream.
Origin = tuple[bytes, bytes, int]

#: A whole (not streamed) upstream body is refused past this many bytes unless the
#: transport is given another bound (``triogate.http.max_upstream_body_bytes``).
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
#: One streamed SSE event is refused past this many bytes unless the transport is given
#: another bound (``triogate.http.max_upstream_event_bytes``).
DEFAULT_MAX_EVENT_BYTES = 4 * 1024 * 1024

# What h11 (httpcore's parser) accepts: a Content-Length is decimal digits (Python's
# int() would also take "-1", "1_0", " 5", "+5"); chunk sizes: ``chunks.py``.
_DIGITS = re.compile(rb"[0-9]+")


class UpstreamFramingError(httpx.RemoteProtocolError):
    """The upstream's answer is framed in a way HTTP/1.1 does not allow (a bad or
    conflicting ``Content-Length``, a bad chunk size, a content coding that was not asked
    for), or is larger than the body bound: it cannot be read, the connection is dropped."""


class BodyTooLarge(UpstreamFramingError):
    """The upstream's body is longer than the transport's body bound."""


def too_large(limit: int, request: httpx.Request | None) -> BodyTooLarge:
    """The error of a body past ``limit`` bytes."""
    return BodyTooLarge(f"upstream body larger than {limit} bytes", request=request)


def set_pacer(pacer: Paced) -> None:
    """Tell this run's upstream reads about its stream pacer (its probe calls this)."""
    watchdog().pacer = pacer


class Pool(Protocol):
    """Where a body hands its connection back (the transport's pool)."""

    async def release(self, conn: UpstreamConnection, *, reuse: bool) -> None:
        """Free the connection's slot; keep it idle if ``reuse``, else close it."""
        ...


@final
class UpstreamConnection:
    """One upstream connection and the bytes read from it but not consumed yet."""

    __slots__ = ("behind", "buffer", "fd", "idle_since", "origin", "plain", "socket", "stream")

    def __init__(self, origin: Hashable, stream: trio.abc.Stream,
                 socket: trio.socket.SocketType):
        self.origin = origin
        self.stream = stream
        self.socket = socket
        # Plain TCP is read off the socket itself: SocketStream.receive_some only adds a
        # conflict detector and a contextmanager that turns OSError into stream errors,
        # once per upstream read (per stream chunk); OSError is mapped below anyway.
        self.plain = isinstance(stream, trio.SocketStream)
        self.fd = socket.fileno()
        self.buffer = bytearray()
        self.idle_since = 0.0
        #: The last watched read found bytes already waiting (the reader is behind).
        self.behind = False

    async def receive(self, timeout_s: float | None, request: httpx.Request | None) -> bytes:
        """Some bytes (b"" at the end of the stream), within ``timeout_s`` (None: the
        caller's deadline bounds it). Always a checkpoint, as ``recv`` is: a stream whose
        upstream keeps its socket readable must still let others run."""
        # A bare CancelScope, not fail_after: this runs once per upstream read (per stream
        # chunk), and fail_after's contextmanager layer cost more than the read's own work.
        # On plain TCP the scope is only entered when the read has to wait: bytes already
        # in the socket (a worker that is behind) cannot time out.
        try:
            if self.plain:
                await trio.lowlevel.checkpoint_if_cancelled()  # before consuming, as recv
                try:
                    data = os.read(self.fd, READ_SIZE)
                except BlockingIOError:
                    pass
                else:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    return data
                if timeout_s is None:
                    return await self._wait_read()
                with trio.CancelScope(deadline=trio.current_time() + timeout_s) as scope:
                    return await self._wait_read()
            else:
                if timeout_s is None:
                    return bytes(await self.stream.receive_some(READ_SIZE))
                with trio.CancelScope(deadline=trio.current_time() + timeout_s) as scope:
                    return bytes(await self.stream.receive_some(READ_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise httpx.ReadError(f"upstream read failed: {exc!r}", request=request) from exc
        assert scope.cancelled_caught
        raise httpx.ReadTimeout("upstream read timed out", request=request)

    async def receive_watched(self, watch: ReadWatch, request: httpx.Request | None) -> bytes:
        """:meth:`receive` for a body's reads, its timeout kept by the run's
        :mod:`.watchdog` instead of a deadline scope per read: a wait stamps
        ``watch.since`` and clears it (one clock read); a wait the watchdog ends
        raises ``httpx.ReadTimeout``, as the scope's expiry did. Always a checkpoint."""
        try:
            if self.plain:
                if self.behind and not watch.dog.pacer.behind:
                    # The last read found bytes waiting: the worker is behind. One more
                    # scheduler pass before this read lets more arrive, so that it (and
                    # the client write after it) carries more chunks (bench/streams.py).
                    # Not while the pacer holds the streams: this read follows a window's
                    # wait already, and the pass would only cost one more wake-up.
                    await trio.lowlevel.checkpoint()
                else:
                    await trio.lowlevel.checkpoint_if_cancelled()  # before consuming
                fd = self.fd
                try:
                    data = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    self.behind = False
                    watch.since = trio.current_time()
                    try:
                        while True:  # _wait_read inlined: a coroutine frame less per wakeup
                            await trio.lowlevel.wait_readable(fd)
                            try:
                                data = os.read(fd, READ_SIZE)
                            except BlockingIOError:
                                continue
                            break
                    finally:
                        watch.since = _INF
                else:
                    self.behind = True
                    await trio.lowlevel.cancel_shielded_checkpoint()
            else:
                watch.since = trio.current_time()
                try:
                    data = bytes(await self.stream.receive_some(READ_SIZE))
                finally:
                    watch.since = _INF
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            if watch.fired:
                raise httpx.ReadTimeout("upstream read timed out", request=request) from None
            raise httpx.ReadError(f"upstream read failed: {exc!r}", request=request) from exc
        if watch.fired:  # the watchdog fired in the pass that brought these bytes: they win
            watchdog().rearm(watch)
        return data

    async def _wait_read(self) -> bytes:
        """``socket.recv`` without trio's wrapper (an async context manager per call),
        once a read found nothing: wait until readable, then read."""
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            try:
                return os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                continue

    async def close(self) -> None:
        await trio.aclose_forcefully(self.stream)


def parse_head(
    head: bytes, request: httpx.Request | None
) -> tuple[int, bytes, list[tuple[bytes, bytes]], bool]:
    """Status, reason, headers and whether the connection may be kept alive."""
    lines = head.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
        raise httpx.RemoteProtocolError(f"bad status line {lines[0][:100]!r}", request=request)
    try:
        status = int(status_line[1])
    except ValueError:
        raise httpx.RemoteProtocolError(
            f"bad status line {lines[0][:100]!r}", request=request
        ) from None
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise httpx.RemoteProtocolError(f"bad header line {line[:100]!r}", request=request)
        headers.append((name, value.strip()))
    reason = status_line[2] if len(status_line) > 2 else b""
    keep = status_line[0] == b"HTTP/1.1"
    for name, value in headers:
        if name.lower() == b"connection":
            tokens = {t.strip().lower() for t in value.split(b",")}
            keep = b"close" not in tokens and (keep or b"keep-alive" in tokens)
    return status, reason, headers, keep


@final
class UpstreamBody(httpx.AsyncByteStream):
    """A response body read off its connection; hands the connection back at its end.

    Each read waits at most ``read_timeout`` (httpx's ``read`` timeout), kept by the run's
    :func:`~triogate.providers.watchdog.watchdog`: one registration per body, a clock read
    per wait, instead of a deadline scope per read (one per stream chunk).
    """

    def __init__(
        self,
        pool: Pool,
        conn: UpstreamConnection,
        request: httpx.Request | None,
        *,
        length: int | None,
        chunked: bool,
        keep_alive: bool,
        read_timeout: float | None,
        limit: int | None = None,
        deadline: float = _INF,
    ) -> None:
        self._pool = pool
        self._conn: UpstreamConnection | None = conn
        self._request = request
        self._length = length
        self._chunked = chunked
        self._keep_alive = keep_alive and (length is not None or chunked)
        self._done = False
        #: Bytes ``__aiter__`` may hand out at most (a whole body; None: no bound).
        self._limit = limit
        #: Trio time after which no read is made (the stream's total time bound).
        self._deadline = deadline
        # Each read's timeout is kept by the run's watchdog (one registration per body,
        # not a deadline scope per read; see watchdog.py).
        self._watch = None if read_timeout is None else watchdog().watch(
            conn.fd, read_timeout, deadline)

    async def _more(self) -> bytes:
        assert self._conn is not None
        if self._deadline != _INF and trio.current_time() >= self._deadline:
            raise httpx.ReadTimeout("upstream stream outlasted its time bound",
                                    request=self._request)
        if self._watch is None:
            return await self._conn.receive(None, self._request)
        return await self._conn.receive_watched(self._watch, self._request)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            raise httpx.StreamClosed()
        if self._limit is not None:
            async for piece in self._bounded(self._limit):
                yield piece
        else:
            async for piece in self._pieces(conn):
                yield piece
        self._done = True
        await self.aclose()

    async def _bounded(self, limit: int) -> AsyncIterator[bytes]:
        """The body's pieces, refused once they come to more than ``limit`` bytes."""
        assert self._conn is not None
        if self._length is not None and self._length > limit:
            raise too_large(limit, self._request)
        total = 0
        async for piece in self._pieces(self._conn):
            total += len(piece)
            if total > limit:
                raise too_large(limit, self._request)
            yield piece

    async def _pieces(self, conn: UpstreamConnection) -> AsyncIterator[bytes]:
        buf = conn.buffer
        if self._length is not None:
            left = self._length
            if buf:
                piece = bytes(buf[:left])
                del buf[:left]
                left -= len(piece)
                if piece:
                    yield piece
            while left > 0:
                data = await self._more()
                if not data:
                    raise httpx.RemoteProtocolError(
                        "upstream closed the connection mid-body", request=self._request
                    )
                if len(data) > left:
                    buf += data[left:]
                    data = data[:left]
                left -= len(data)
                yield data
        elif self._chunked:
            async for piece in self._chunks(conn):
                yield piece
        else:  # until the connection closes
            if buf:
                piece = bytes(buf)
                buf.clear()
                yield piece
            while data := await self._more():
                yield data

    async def _line(self, conn: UpstreamConnection) -> bytes:
        buf = conn.buffer
        while (end := buf.find(b"\r\n")) < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("chunk header too long", request=self._request)
            data = await self._more()
            if not data:
                raise httpx.RemoteProtocolError(
                    "upstream closed the connection mid-body", request=self._request
                )
            buf += data
        line = bytes(buf[:end])
        del buf[: end + 2]
        return line

    async def _chunks(self, conn: UpstreamConnection) -> AsyncIterator[bytes]:
        buf = conn.buffer
        while True:
            size_line = await self._line(conn)
            size = chunk_size_of(size_line)
            if size is None:
                raise UpstreamFramingError(
                    f"bad chunk size {size_line[:40]!r}", request=self._request)
            if size == 0:
                while await self._line(conn):  # trailers, up to the empty line
                    pass
                return
            while len(buf) < size + 2:
                data = await self._more()
                if not data:
                    raise httpx.RemoteProtocolError(
                        "upstream closed the connection mid-chunk", request=self._request
                    )
                buf += data
            piece = bytes(buf[:size])
            if buf[size : size + 2] != b"\r\n":
                raise httpx.RemoteProtocolError("chunk without CRLF", request=self._request)
            del buf[: size + 2]
            # Chunks the same read brought leave together: a stream that fell behind
            # catches up in one pass downstream (one SSE parse and one client write
            # per read, not per chunk).
            pieces = [piece]
            while (more := buffered_chunk(buf)) is not None:
                pieces.append(more)
            yield piece if len(pieces) == 1 else b"".join(pieces)

    async def read_some(self) -> bytes:
        """Every body byte that is here now, waiting for one upstream read if none is
        (b"" at the body's end); a checkpoint.

        The stream hot path (``providers/rawsse.py``): one call per upstream read instead
        of a chunk per step through ``__aiter__``'s generators and httpx's, and all the
        chunks that one read brought come back together. Mixing it with ``__aiter__`` on
        the same body is not supported.
        """
        conn = self._conn
        if conn is None:
            if self._done:
                await trio.lowlevel.checkpoint()
                return b""
            raise httpx.StreamClosed()
        buf = conn.buffer
        if not self._chunked:
            left = self._length
            if left == 0:
                await self._finish()
                return b""
            if buf:
                data = bytes(buf if left is None else buf[:left])
                del buf[: len(data)]
                await trio.lowlevel.checkpoint()
            else:
                data = await self._more()
                if not data:
                    if left is not None:
                        raise httpx.RemoteProtocolError(
                            "upstream closed the connection mid-body", request=self._request
                        )
                    await self._finish()
                    return b""
                if left is not None and len(data) > left:
                    buf += data[left:]
                    data = data[:left]
            if left is not None:
                self._length = left - len(data)
            return data
        waited = False  # the upstream read below is this call's checkpoint
        while True:
            pieces = []
            while (piece := buffered_chunk(buf)) is not None:
                pieces.append(piece)
            if pieces:
                if not waited:
                    await trio.lowlevel.checkpoint()
                return b"".join(pieces)
            # No whole data chunk buffered: the last chunk, a malformed one, or one that
            # needs more bytes.
            end = buf.find(b"\r\n")
            if end >= 0:
                size = chunk_size(buf, end)
                if size is None:
                    raise UpstreamFramingError(
                        f"bad chunk size {bytes(buf[:end])[:40]!r}", request=self._request
                    )
                if size == 0:
                    del buf[: end + 2]
                    while await self._line(conn):  # trailers, up to the empty line
                        pass
                    await self._finish()
                    return b""
                if len(buf) >= end + 2 + size + 2:  # whole, yet not taken: no CRLF after
                    raise httpx.RemoteProtocolError("chunk without CRLF", request=self._request)
            elif len(buf) > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("chunk header too long", request=self._request)
            # _more inlined: a coroutine frame less per read (the stream's hot path).
            if self._deadline != _INF and trio.current_time() >= self._deadline:
                raise httpx.ReadTimeout("upstream stream outlasted its time bound",
                                        request=self._request)
            watch = self._watch
            data = await (conn.receive(None, self._request) if watch is None
                          else conn.receive_watched(watch, self._request))
            waited = True
            if not buf:
                # The usual read: whole chunks (one, or several when the worker is
                # behind), taken off the read's bytes without the buffer round trip.
                joined, taken = whole_chunks(data)
                if taken:
                    if taken < len(data):
                        buf += memoryview(data)[taken:]
                    return joined
            if not data:
                raise httpx.RemoteProtocolError(
                    "upstream closed the connection mid-chunk", request=self._request
                )
            buf += data

    async def _finish(self) -> None:
        self._done = True
        await self.aclose()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._watch is not None:
            watchdog().unwatch(self._watch)
        if not self._done and self._chunked and conn.buffer == LAST_CHUNK:
            # Every data chunk was taken and the last one is here: the body is whole
            # (a stream whose reader stopped at ``data: [DONE]``), the connection reusable.
            conn.buffer.clear()
            self._done = True
        await self._pool.release(conn, reuse=self._done and self._keep_alive)


async def send_request(
    conn: UpstreamConnection, data: bytes, timeout_s: float | None, request: httpx.Request | None
) -> None:
    """Write ``data`` within ``timeout_s`` (None: the caller's deadline bounds it).

    On plain TCP, one ``os.write`` first (a request fits the socket buffer): trio's
    ``send_all`` adds a conflict detector, an async context manager and a scheduler pass
    even when the kernel takes everything at once. Not a checkpoint then: every caller
    reads the answer next, which waits.
    """
    try:
        if conn.plain:
            try:
                sent = os.write(conn.fd, data)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        if timeout_s is None:
            await conn.stream.send_all(data)
        else:
            with trio.fail_after(timeout_s):
                await conn.stream.send_all(data)
    except trio.TooSlowError as exc:
        raise httpx.WriteTimeout("upstream write timed out", request=request) from exc
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        raise httpx.WriteError(f"upstream write failed: {exc!r}", request=request) from exc


async def read_head(
    conn: UpstreamConnection, read_timeout: float | None, request: httpx.Request | None, *,
    head_request: bool, accepts_coding: bool = False,
) -> tuple[int, bytes, list[tuple[bytes, bytes]], bool, int | None, bool]:
    """Read a response head (skipping 1xx): status, reason, headers, keep-alive, and the
    body's framing (``Content-Length`` or None, chunked).

    Framing is checked as h11 checks it (``UpstreamFramingError``); a body with a content
    coding is refused unless ``accepts_coding`` (the request asked for one)."""
    buf = conn.buffer
    while True:
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("response head too long", request=request)
            data = await conn.receive(read_timeout, request)
            if not data:
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=request
                )
            buf += data
        head = bytes(buf[:end])
        del buf[: end + 4]
        status, reason, headers, keep_alive = parse_head(head, request)
        if not 100 <= status < 200 or status == 101:
            break
    length: int | None = None
    chunked = False
    coded = False
    for name, value in headers:
        lname = name.lower()
        if lname == b"transfer-encoding":
            if chunked or value.strip().lower() != b"chunked":  # as h11: chunked, once
                raise UpstreamFramingError(
                    f"unsupported transfer-encoding {value[:40]!r}", request=request)
            chunked = True
        elif lname == b"content-length":
            # As h11: digits only; a list or a repeat must say one value.
            values = {v.strip() for v in value.split(b",")}
            one = values.pop() if len(values) == 1 else b""
            if _DIGITS.fullmatch(one) is None or (length is not None and length != int(one)):
                raise UpstreamFramingError(
                    f"bad or conflicting content-length {value[:40]!r}", request=request)
            length = int(one)
        elif lname == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            coded = True
    if chunked:
        length = None
    if coded and not accepts_coding:
        # The request asked for none (identity): a coded body is not decoded (a small
        # body can inflate to gigabytes), it is refused.
        raise UpstreamFramingError("upstream sent a content-encoding that was not asked for",
                                   request=request)
    if head_request or status in NO_BODY_STATUS:
        length, chunked = 0, False
    return status, reason, headers, keep_alive, length, chunked


async def read_exactly(conn: UpstreamConnection, length: int, limit: int) -> bytes:
    """The next ``length`` bytes of the connection (a ``Content-Length`` body), refused
    before any is read if ``length`` is over ``limit``."""
    if length > limit:
        raise too_large(limit, None)
    buf = conn.buffer
    while len(buf) < length:
        data = await conn.receive(None, None)
        if not data:
            raise httpx.RemoteProtocolError("upstream closed the connection mid-body")
        buf += data
    body = bytes(buf[:length])
    del buf[:length]
    return body
