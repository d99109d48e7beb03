"""A lean HTTP/1.1 transport for httpx: O(1) connection pool, no per-request pool scan.

httpx's default transport (httpcore) walks its whole connection pool on every request
and on every response close (``_assign_requests_to_connections``: ``is_idle``,
``has_expired``, ``is_available`` on each connection, a poll per idle socket). With a
thousand upstream connections in the pool that walk is most of a request's CPU, and it
grows with concurrency: the gateway's throughput fell as connections were added. This
transport keeps, per origin, a LIFO stack of idle connections: a request pops one (and
checks only that one: expiry, and whether the server closed it), a finished response
pushes it back. Parsing is the minimum HTTP/1.1 an upstream API needs: a status line,
headers, and a body framed by ``Content-Length``, ``chunked`` or the connection's end.
Content decoding (gzip, ...), redirects (off), auth and the request's shape stay httpx's.

It sits *under* httpx's API (``httpx.AsyncClient(transport=UpstreamTransport(...))``), so
callers, timeouts (``connect``, ``read``, ``write``, ``pool``) and exception classes are
httpx's: ``ConnectError``, ``ConnectTimeout``, ``ReadError``, ``ReadTimeout``,
``WriteError``, ``WriteTimeout``, ``PoolTimeout``, ``RemoteProtocolError``.
"""

from __future__ import annotations

import os
import ssl
import weakref
from typing import TYPE_CHECKING, final

import httpx
import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

_MAX_HEAD_BYTES = 64 * 1024
_READ_SIZE = 65536
_DEFAULT_PORTS = {b"http": 80, b"https": 443}
_NO_BODY_STATUS = frozenset((204, 304))
_LAST_CHUNK = b"0\r\n\r\n"

Origin = tuple[bytes, bytes, int]

#: Seconds a connection attempt may take at most.
CONNECT_TIMEOUT_S = 10.0

_TRANSPORTS: weakref.WeakKeyDictionary[httpx.AsyncClient, UpstreamTransport] = (
    weakref.WeakKeyDictionary()
)


def transport_of(client: httpx.AsyncClient) -> UpstreamTransport | None:
    """The :class:`UpstreamTransport` ``client`` was built on (:func:`register`), if any."""
    return _TRANSPORTS.get(client)


def body_of(response: httpx.Response) -> _Body | None:
    """The transport body under ``response`` (httpx binds it in a ``BoundAsyncStream``,
    whose ``_stream`` it is), or None for a response from another transport."""
    stream = getattr(response.stream, "_stream", response.stream)
    return stream if isinstance(stream, _Body) else None


def register(client: httpx.AsyncClient, transport: UpstreamTransport) -> httpx.AsyncClient:
    """Remember that ``client`` sends through ``transport`` (for the fast path)."""
    _TRANSPORTS[client] = transport
    return client


@final
class _Connection:
    """One upstream connection and the bytes read from it but not consumed yet."""

    __slots__ = ("buffer", "fd", "idle_since", "origin", "plain", "socket", "stream")

    def __init__(self, origin: Origin, stream: trio.abc.Stream, socket: trio.socket.SocketType):
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
                    data = os.read(self.fd, _READ_SIZE)
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
                    return bytes(await self.stream.receive_some(_READ_SIZE))
                with trio.CancelScope(deadline=trio.current_time() + timeout_s) as scope:
                    return bytes(await self.stream.receive_some(_READ_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise httpx.ReadError(f"upstream read failed: {exc!r}", request=request) from exc
        assert scope.cancelled_caught
        raise httpx.ReadTimeout("upstream read timed out", request=request)

    async def _wait_read(self) -> bytes:
        """``socket.recv`` without trio's wrapper (an async context manager per call),
        once a read found nothing: wait until readable, then read."""
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            try:
                return os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                continue

    async def close(self) -> None:
        await trio.aclose_forcefully(self.stream)


def _parse_head(
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
class _Body(httpx.AsyncByteStream):
    """A response body read off its connection; hands the connection back at its end."""

    def __init__(
        self,
        transport: UpstreamTransport,
        conn: _Connection,
        request: httpx.Request | None,
        *,
        length: int | None,
        chunked: bool,
        keep_alive: bool,
        read_timeout: float | None,
    ) -> None:
        self._transport = transport
        self._conn: _Connection | None = conn
        self._request = request
        self._length = length
        self._chunked = chunked
        self._keep_alive = keep_alive and (length is not None or chunked)
        self._timeout = read_timeout
        self._done = False

    async def _more(self) -> bytes:
        assert self._conn is not None
        data = await self._conn.receive(self._timeout, self._request)
        return data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            raise httpx.StreamClosed()
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
        self._done = True
        await self.aclose()

    async def _line(self, conn: _Connection) -> bytes:
        buf = conn.buffer
        while (end := buf.find(b"\r\n")) < 0:
            if len(buf) > _MAX_HEAD_BYTES:
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

    async def _chunks(self, conn: _Connection) -> AsyncIterator[bytes]:
        buf = conn.buffer
        while True:
            size_line = await self._line(conn)
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise httpx.RemoteProtocolError(
                    f"bad chunk size {size_line[:40]!r}", request=self._request
                ) from None
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
            while (more := _buffered_chunk(buf)) is not None:
                pieces.append(more)
            yield piece if len(pieces) == 1 else b"".join(pieces)

    async def read_some(self) -> bytes:
        """Every body byte that is here now, waiting for one upstream read if none is
        (b"" at the body's end); a checkpoint.

        The stream hot path (``providers/rawchat.py``): one call per upstream read instead
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
        while True:
            pieces = []
            while (piece := _buffered_chunk(buf)) is not None:
                pieces.append(piece)
            if pieces:
                await trio.lowlevel.checkpoint()
                return b"".join(pieces)
            # No whole data chunk buffered: the last chunk, a malformed one, or one that
            # needs more bytes.
            end = buf.find(b"\r\n")
            if end >= 0:
                size = _chunk_size(buf, end)
                if size is None:
                    raise httpx.RemoteProtocolError(
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
            elif len(buf) > _MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("chunk header too long", request=self._request)
            data = await self._more()
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
        if not self._done and self._chunked and conn.buffer == _LAST_CHUNK:
            # Every data chunk was taken and the last one is here: the body is whole
            # (a stream whose reader stopped at ``data: [DONE]``), the connection reusable.
            conn.buffer.clear()
            self._done = True
        await self._transport._release(conn, reuse=self._done and self._keep_alive)


def _chunk_size(buf: bytearray, end: int) -> int | None:
    """The size on the chunk-size line ``buf[:end]``, or None if it is not one."""
    try:
        return int(buf[:end], 16)  # no extension (the usual line): no copy, no split
    except ValueError:
        pass
    try:
        return int(bytes(buf[:end]).split(b";", 1)[0].strip(), 16)
    except ValueError:
        return None


def _buffered_chunk(buf: bytearray) -> bytes | None:
    """Take the next data chunk if it is whole in ``buf``; else None and ``buf`` as it
    was (an incomplete, last or malformed chunk is left for ``_Body._chunks``)."""
    end = buf.find(b"\r\n")
    if end < 0:
        return None
    size = _chunk_size(buf, end)
    if size is None:
        return None
    start = end + 2
    if size == 0 or len(buf) < start + size + 2 or buf[start + size : start + size + 2] != b"\r\n":
        return None
    piece = bytes(buf[start : start + size])
    del buf[: start + size + 2]
    return piece


async def _send(
    conn: _Connection, data: bytes, timeout_s: float | None, request: httpx.Request | None
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


async def _read_head(
    conn: _Connection, read_timeout: float | None, request: httpx.Request | None, *,
    head_request: bool,
) -> tuple[int, bytes, list[tuple[bytes, bytes]], bool, int | None, bool]:
    """Read a response head (skipping 1xx): status, reason, headers, keep-alive, and the
    body's framing (``Content-Length`` or None, chunked)."""
    buf = conn.buffer
    while True:
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > _MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("response head too long", request=request)
            data = await conn.receive(read_timeout, request)
            if not data:
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=request
                )
            buf += data
        head = bytes(buf[:end])
        del buf[: end + 4]
        status, reason, headers, keep_alive = _parse_head(head, request)
        if not 100 <= status < 200 or status == 101:
            break
    length: int | None = None
    chunked = False
    for name, value in headers:
        lname = name.lower()
        if lname == b"transfer-encoding":
            chunked = value.lower().split(b",")[-1].strip() == b"chunked"
        elif lname == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise httpx.RemoteProtocolError(
                    f"bad content-length {value[:40]!r}", request=request
                ) from None
    if chunked:
        length = None
    if head_request or status in _NO_BODY_STATUS:
        length, chunked = 0, False
    return status, reason, headers, keep_alive, length, chunked


async def _read_exactly(conn: _Connection, length: int) -> bytes:
    """The next ``length`` bytes of the connection (a ``Content-Length`` body)."""
    buf = conn.buffer
    while len(buf) < length:
        data = await conn.receive(None, None)
        if not data:
            raise httpx.RemoteProtocolError("upstream closed the connection mid-body")
        buf += data
    body = bytes(buf[:length])
    del buf[:length]
    return body


def _post_prefix(url: str, headers: Mapping[str, str]) -> tuple[Origin, bytes]:
    """A POST's origin and its head up to the ``Content-Length`` line.

    Header values are encoded as httpx does (ASCII, else UTF-8); a name or value with a
    CR, LF or NUL is refused, as h11 would.
    """
    parsed = httpx.URL(url)
    scheme = parsed.raw_scheme
    if scheme not in _DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(f"unsupported scheme {scheme!r}")
    origin = (scheme, parsed.raw_host, parsed.port or _DEFAULT_PORTS[scheme])
    parts = [b"POST ", parsed.raw_path, b" HTTP/1.1\r\nhost: ", parsed.netloc, b"\r\n"]
    for name, value in {**headers, "accept-encoding": "identity"}.items():
        raw_name = name.encode("ascii")
        try:
            raw_value = value.encode("ascii")
        except UnicodeEncodeError:
            raw_value = value.encode("utf-8")
        if (not raw_name or any(c in raw_name for c in b"\r\n\0: ")
                or any(c in raw_value for c in b"\r\n\0")):
            raise httpx.LocalProtocolError(f"illegal header {name[:40]!r}")
        parts += [raw_name, b": ", raw_value, b"\r\n"]
    return origin, b"".join(parts)


#: Distinct (url, headers) prefixes kept at most (deployments x key sets: few).
_MAX_PREFIXES = 1024


@final
class UpstreamTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over trio sockets (TLS for https), pooled per origin, for httpx.

    Args:
        max_connections: connections open at once (in use + idle), all origins; a request
            beyond waits up to its ``pool`` timeout (``httpx.PoolTimeout``).
        max_keepalive_connections: idle connections kept per origin.
        keepalive_expiry_s: an idle connection older than this is closed, not reused.
        ssl_context: for https (default: httpx's, which verifies with certifi).
    """

    def __init__(
        self,
        *,
        max_connections: int,
        max_keepalive_connections: int,
        keepalive_expiry_s: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.max_keepalive_connections = max_keepalive_connections
        self._slots = trio.Semaphore(max_connections)
        self._max_idle = max_keepalive_connections
        self._expiry_s = keepalive_expiry_s
        self._ssl_context = ssl_context
        self._idle: dict[Origin, list[_Connection]] = {}
        self._prefixes: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Origin, bytes]] = {}
        #: Connections opened so far (tests and benchmarks read it).
        self.connections_opened = 0

    def idle_connections(self) -> int:
        """Idle connections in the pool, all origins."""
        return sum(len(v) for v in self._idle.values())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported scheme {scheme!r}", request=request)
        origin = (scheme, url.raw_host, url.port or _DEFAULT_PORTS[scheme])
        pool_timeout = timeouts.get("pool")
        try:
            await trio.lowlevel.checkpoint_if_cancelled()  # before anything is sent
            try:
                self._slots.acquire_nowait()  # as in _post: the reads below are checkpoints
            except trio.WouldBlock:
                with trio.fail_after(pool_timeout if pool_timeout is not None
                                     else float("inf")):
                    await self._slots.acquire()
        except trio.TooSlowError as exc:
            raise httpx.PoolTimeout("no upstream connection free", request=request) from exc
        conn: _Connection | None = None
        try:
            conn = self._pop_idle(origin)
            if conn is None:
                conn = await self._connect(origin, request, timeouts.get("connect"))
            return await self._exchange(conn, request, timeouts)
        except BaseException:
            # Released first: under a cancelled scope the close below re-raises Cancelled.
            self._slots.release()
            if conn is not None:
                await conn.close()
            raise

    def _pop_idle(self, origin: Origin) -> _Connection | None:
        stack = self._idle.get(origin)
        now = trio.current_time()
        # The oldest sit at the bottom: expire them too, or after a burst they would stay
        # open (unused under the newer ones) until the server drops them.
        while stack and now - stack[0].idle_since >= self._expiry_s:
            self._discard(stack.pop(0))
        while stack:
            conn = stack.pop()
            # Readable while idle: the server closed it (or sent something unasked).
            if now - conn.idle_since < self._expiry_s and not conn.socket.is_readable():
                return conn
            self._discard(conn)
        return None

    def _discard(self, conn: _Connection) -> None:
        # Forceful close of an idle connection needs no await: close the socket itself.
        conn.socket.close()

    async def _connect(
        self, origin: Origin, request: httpx.Request | None, timeout_s: float | None
    ) -> _Connection:
        scheme, host, port = origin
        hostname = host.decode("ascii")
        try:
            with trio.fail_after(timeout_s if timeout_s is not None else float("inf")):
                tcp = await trio.open_tcp_stream(hostname, port)
                stream: trio.abc.Stream = tcp
                if scheme == b"https":
                    if self._ssl_context is None:
                        self._ssl_context = httpx.create_ssl_context()
                    tls = trio.SSLStream(
                        tcp, self._ssl_context, server_hostname=hostname, https_compatible=True
                    )
                    try:
                        await tls.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(tcp)
                        raise
                    stream = tls
        except trio.TooSlowError as exc:
            raise httpx.ConnectTimeout(f"connecting to {hostname}:{port} timed out",
                                       request=request) from exc
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise httpx.ConnectError(f"cannot connect to {hostname}:{port}: {exc}",
                                     request=request) from exc
        self.connections_opened += 1
        return _Connection(origin, stream, tcp.socket)

    async def _exchange(
        self, conn: _Connection, request: httpx.Request, timeouts: dict[str, float | None]
    ) -> httpx.Response:
        url = request.url
        target = url.raw_path
        parts = [request.method.encode(), b" ", target, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            parts += [name, b": ", value, b"\r\n"]
        parts.append(b"\r\n")
        if isinstance(request.stream, httpx.ByteStream):
            content = request.content
        else:
            content = b"".join([chunk async for chunk in request.stream])  # type: ignore[union-attr]
        parts.append(content)
        await _send(conn, b"".join(parts), timeouts.get("write"), request)
        read_timeout = timeouts.get("read")
        status, reason, headers, keep_alive, length, chunked = await _read_head(
            conn, read_timeout, request, head_request=request.method == "HEAD")
        if request.headers.get("connection", "").lower() == "close":
            keep_alive = False
        body = _Body(self, conn, request, length=length, chunked=chunked,
                     keep_alive=keep_alive, read_timeout=read_timeout)
        return httpx.Response(
            status,
            headers=headers,
            stream=body,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def _release(self, conn: _Connection, *, reuse: bool) -> None:
        self._slots.release()
        if reuse and not conn.buffer:
            stack = self._idle.setdefault(conn.origin, [])
            if len(stack) < self._max_idle:
                conn.idle_since = trio.current_time()
                stack.append(conn)
                return
        await conn.close()

    async def post(
        self, url: str, *, headers: Mapping[str, str], content: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        """POST ``content`` and read the whole answer: ``(status, body)``.

        The hot path of a non-streamed upstream call, without httpx's request and
        response objects: the head up to ``Content-Length`` is built once per (url,
        headers) and kept, the request asks for no content coding (so the body is as
        sent). ``timeout_s`` bounds the whole call (one deadline; connecting at most
        :data:`CONNECT_TIMEOUT_S` of it). Errors are httpx's (a timeout:
        ``httpx.TimeoutException``, or ``ConnectTimeout``).
        """
        prefix = self._prefix(url, headers)
        # A bare scope, not fail_after (a generator context manager around the same scope).
        with trio.CancelScope(deadline=trio.current_time() + timeout_s):
            return await self._post(prefix, content, timeout_s)
        raise httpx.TimeoutException(f"upstream call took over {timeout_s} s")

    async def open_stream(
        self, url: str, *, headers: Mapping[str, str], content: bytes, timeout_s: float
    ) -> httpx.Response:
        """POST ``content`` and return the response once its head is read; its body
        (``stream``, a transport body: ``read_some``) is read by the caller, who must
        close the response.

        The hot path of a streamed upstream call, as :meth:`post` is of a whole one:
        no ``httpx.Request``, no URL parsing per call (the head up to
        ``Content-Length`` is kept per url and headers), no cookie or redirect layers;
        the request asks for no content coding. ``timeout_s`` bounds the wait for a
        connection slot, the connect (at most :data:`CONNECT_TIMEOUT_S`), the write,
        and then each read, body reads included (httpx's ``read`` timeout). Errors are
        httpx's (a timeout: ``httpx.TimeoutException``; the slot: ``PoolTimeout``).
        """
        origin, head = self._prefix(url, headers)
        await trio.lowlevel.checkpoint_if_cancelled()  # before anything is sent
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            acquired = False
            with trio.move_on_after(timeout_s):
                await self._slots.acquire()
                acquired = True
            if not acquired:
                raise httpx.PoolTimeout("no upstream connection free") from None
        conn: _Connection | None = None
        try:
            conn = self._pop_idle(origin)
            if conn is None:
                conn = await self._connect(origin, None, min(timeout_s, CONNECT_TIMEOUT_S))
            await _send(conn, b"".join((head, b"content-length: %d\r\n\r\n" % len(content),
                                        content)), timeout_s, None)
            status, reason, raw_headers, keep_alive, length, chunked = await _read_head(
                conn, timeout_s, None, head_request=False)
        except BaseException:
            self._slots.release()  # first: a cancelled close re-raises Cancelled
            if conn is not None:
                await conn.close()
            raise
        body = _Body(self, conn, None, length=length, chunked=chunked,
                     keep_alive=keep_alive, read_timeout=timeout_s)
        return httpx.Response(status, headers=raw_headers, stream=body,
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason})

    def _prefix(self, url: str, headers: Mapping[str, str]) -> tuple[Origin, bytes]:
        key = (url, tuple(headers.items()))
        prefix = self._prefixes.get(key)
        if prefix is None:
            if len(self._prefixes) >= _MAX_PREFIXES:
                self._prefixes.clear()
            prefix = self._prefixes[key] = _post_prefix(url, headers)
        return prefix

    async def _post(
        self, prefix: tuple[Origin, bytes], content: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        origin, head = prefix
        # A free slot without Semaphore.acquire's scheduler pass: the read of the answer
        # below waits, and is the call's checkpoint. Cancellation is still checked before
        # anything is sent (a request the upstream sees may be billed).
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
        conn: _Connection | None = None
        handed = False  # the slot and the connection belong to a _Body
        try:
            conn = self._pop_idle(origin)
            if conn is None:
                conn = await self._connect(origin, None, min(timeout_s, CONNECT_TIMEOUT_S))
            await _send(conn, b"".join((head, b"content-length: %d\r\n\r\n" % len(content),
                                        content)), None, None)
            status, _, _, keep_alive, length, chunked = await _read_head(
                conn, None, None, head_request=False)
            if length is None:  # chunked, or up to the connection's end
                body = _Body(self, conn, None, length=None, chunked=chunked,
                             keep_alive=keep_alive, read_timeout=None)
                handed = True
                try:
                    chunks = [chunk async for chunk in body]
                finally:
                    await body.aclose()
                return status, b"".join(chunks)
            content = await _read_exactly(conn, length)
        except BaseException:
            if not handed:
                self._slots.release()  # first: a cancelled close re-raises Cancelled
                if conn is not None:
                    await conn.close()
            raise
        await self._release(conn, reuse=keep_alive)
        return status, content

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for stack in idle.values():
            for conn in stack:
                await conn.close()
