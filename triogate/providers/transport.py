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
The wire side of one connection (writing the request, reading the head and the body) is
:mod:`.http1`.

It sits *under* httpx's API (``httpx.AsyncClient(transport=UpstreamTransport(...))``), so
callers, timeouts (``connect``, ``read``, ``write``, ``pool``) and exception classes are
httpx's: ``ConnectError``, ``ConnectTimeout``, ``ReadError``, ``ReadTimeout``,
``WriteError``, ``WriteTimeout``, ``PoolTimeout``, ``RemoteProtocolError``.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl
import weakref
from typing import TYPE_CHECKING, cast, final

import httpx
import trio

from triogate.providers.egress import (
    DIRECT,
    Egress,
    EnvironmentProxies,
    Proxy,
    open_tunnel,
    proxy_for,
    ssl_context,
)
from triogate.providers.http1 import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_EVENT_BYTES,
    UpstreamBody,
    UpstreamConnection,
    read_exactly,
    read_head,
    send_request,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.providers.http1 import Origin

#: Where a connection is pooled: its upstream's origin and the egress that reaches it.
PoolKey = tuple[bytes, bytes, int, Egress]

_DEFAULT_PORTS = {b"http": 80, b"https": 443}


#: Seconds a connection attempt may take at most.
CONNECT_TIMEOUT_S = 10.0

_TRANSPORTS: weakref.WeakKeyDictionary[httpx.AsyncClient, UpstreamTransport] = (
    weakref.WeakKeyDictionary()
)


def transport_of(client: httpx.AsyncClient) -> UpstreamTransport | None:
    """The :class:`UpstreamTransport` ``client`` was built on (:func:`register`), if any."""
    return _TRANSPORTS.get(client)


def body_of(response: httpx.Response) -> UpstreamBody | None:
    """The transport body under ``response`` (httpx binds it in a ``BoundAsyncStream``,
    whose ``_stream`` it is), or None for a response from another transport."""
    stream = getattr(response.stream, "_stream", response.stream)
    return stream if isinstance(stream, UpstreamBody) else None


def register(client: httpx.AsyncClient, transport: UpstreamTransport) -> httpx.AsyncClient:
    """Remember that ``client`` sends through ``transport`` (for the fast path)."""
    _TRANSPORTS[client] = transport
    return client


def _post_prefix(url: str, headers: Mapping[str, str], proxy: Proxy | None
                 ) -> tuple[Origin, bytes]:
    """A POST's origin and its head up to the ``Content-Length`` line.

    Header values are encoded as httpx does (ASCII, else UTF-8); a name or value with a
    CR, LF or NUL is refused, as h11 would. A plain http request through a ``proxy`` names
    the whole URL as its target (and carries the proxy's credentials); an https one goes
    through a tunnel, as if direct.
    """
    parsed = httpx.URL(url)
    scheme = parsed.raw_scheme
    if scheme not in _DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(f"unsupported scheme {scheme!r}")
    origin = (scheme, parsed.raw_host, parsed.port or _DEFAULT_PORTS[scheme])
    target = parsed.raw_path
    extra: dict[str, str] = {}
    if proxy is not None and scheme == b"http":
        target = b"http://" + parsed.netloc + parsed.raw_path
        if proxy.authorization is not None:
            extra["proxy-authorization"] = proxy.authorization
    parts = [b"POST ", target, b" HTTP/1.1\r\nhost: ", parsed.netloc, b"\r\n"]
    for name, value in {**headers, **extra, "accept-encoding": "identity"}.items():
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


@functools.lru_cache(maxsize=256)
def _ip_family(host: str) -> socket.AddressFamily | None:
    """The address family of an IP literal host (IPv6 as the URL's ``raw_host`` has it,
    without brackets); None for a name, which needs resolving."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


async def _connect_ip(family: socket.AddressFamily, host: str, port: int) -> trio.SocketStream:
    """A TCP connection to an IP literal: one socket and its connect.

    ``trio.open_tcp_stream`` resolves the host (a literal too), then runs its happy
    eyeballs in a nursery, a task per address and a cancel scope per attempt: ~180 µs of
    CPU per connection on the bench host against ~90 here (``bench/streams.py``;
    a stream usually opens its own connection when thousands are open at once). With one
    address there is nothing to race. ``trio.SocketStream`` sets TCP_NODELAY, as there.
    """
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def httpx_origin(url: str) -> Origin:
    """``url``'s (scheme, host, port)."""
    parsed = httpx.URL(url)
    scheme = parsed.raw_scheme
    if scheme not in _DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(f"unsupported scheme {scheme!r}")
    return scheme, parsed.raw_host, parsed.port or _DEFAULT_PORTS[scheme]


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
        ssl_context: for https with ``ssl_verify`` true (default: the bundle
            ``cert_file`` names, else httpx's, which verifies with certifi).
        max_body_bytes: a whole (not streamed) body is refused past this many bytes
            (``BodyTooLarge``, the connection dropped).
        max_event_bytes: one streamed SSE event is refused past this many bytes (the
            stream readers, ``sse.py`` and ``rawsse.py``, read it here).
        environment: the proxies the environment names (None: none).
        cert_file: ``SSL_CERT_FILE``, the CA bundle verified against by default.

    Each request may name its :class:`~triogate.providers.egress.Egress` (a proxy, TLS
    verification); connections are pooled per origin and egress.
    """

    def __init__(
        self,
        *,
        max_connections: int,
        max_keepalive_connections: int,
        keepalive_expiry_s: float,
        ssl_context: ssl.SSLContext | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        environment: EnvironmentProxies | None = None,
        cert_file: str | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.max_keepalive_connections = max_keepalive_connections
        self._slots = trio.Semaphore(max_connections)
        self._max_idle = max_keepalive_connections
        self._expiry_s = keepalive_expiry_s
        self._ssl_context = ssl_context
        self.max_body_bytes = max_body_bytes
        self.max_event_bytes = max_event_bytes
        self._environment = environment or EnvironmentProxies({})
        self._cert_file = cert_file
        self._idle: dict[PoolKey, list[UpstreamConnection]] = {}
        self._prefixes: dict[tuple[str, tuple[tuple[str, str], ...], Egress],
                             tuple[PoolKey, Proxy | None, bytes]] = {}
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
        egress = request.extensions.get("triogate_egress", DIRECT)
        key: PoolKey = (scheme, url.raw_host, url.port or _DEFAULT_PORTS[scheme], egress)
        proxy = self._proxy(key)
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
        conn: UpstreamConnection | None = None
        try:
            conn = self._pop_idle(key)
            if conn is None:
                conn = await self._connect(key, proxy, request, timeouts.get("connect"))
            return await self._exchange(conn, request, timeouts, proxy)
        except BaseException:
            # Released first: under a cancelled scope the close below re-raises Cancelled.
            self._slots.release()
            if conn is not None:
                await conn.close()
            raise

    def _proxy(self, key: PoolKey) -> Proxy | None:
        scheme, host, _, egress = key
        try:
            return proxy_for(egress, self._environment, scheme.decode("ascii"),
                             host.decode("ascii"))
        except ValueError as exc:
            raise httpx.ProxyError(str(exc)) from None

    def _tls_context(self, verify: bool | str) -> ssl.SSLContext:
        if verify is True and self._ssl_context is not None:
            return self._ssl_context
        return ssl_context(verify, self._cert_file)

    def _pop_idle(self, origin: PoolKey) -> UpstreamConnection | None:
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

    def _discard(self, conn: UpstreamConnection) -> None:
        # Forceful close of an idle connection needs no await: close the socket itself.
        conn.socket.close()

    async def _connect(
        self, origin: PoolKey, proxy: Proxy | None, request: httpx.Request | None,
        timeout_s: float | None,
    ) -> UpstreamConnection:
        scheme, host, port, egress = origin
        hostname = host.decode("ascii")
        # Through a proxy the TCP connection is the proxy's (a tunnel for https).
        tcp_host, tcp_port = (hostname, port) if proxy is None else (proxy.host, proxy.port)
        try:
            with trio.fail_after(timeout_s if timeout_s is not None else float("inf")):
                family = _ip_family(tcp_host)
                tcp = (await trio.open_tcp_stream(tcp_host, tcp_port) if family is None
                       else await _connect_ip(family, tcp_host, tcp_port))
                stream: trio.abc.Stream = tcp
                try:
                    if proxy is not None and scheme == b"https":
                        await open_tunnel(tcp, proxy, hostname, port)
                    if scheme == b"https":
                        tls = trio.SSLStream(tcp, self._tls_context(egress.ssl_verify),
                                             server_hostname=hostname, https_compatible=True)
                        await tls.do_handshake()
                        stream = tls
                except BaseException:
                    await trio.aclose_forcefully(tcp)
                    raise
        except trio.TooSlowError as exc:
            raise httpx.ConnectTimeout(f"connecting to {hostname}:{port} timed out",
                                       request=request) from exc
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            via = "" if proxy is None else f" through proxy {proxy.host}:{proxy.port}"
            raise httpx.ConnectError(f"cannot connect to {hostname}:{port}{via}: {exc}",
                                     request=request) from exc
        self.connections_opened += 1
        return UpstreamConnection(origin, stream, tcp.socket)

    async def _exchange(
        self, conn: UpstreamConnection, request: httpx.Request,
        timeouts: dict[str, float | None], proxy: Proxy | None,
    ) -> httpx.Response:
        url = request.url
        target = url.raw_path
        if proxy is not None and url.raw_scheme == b"http":
            target = b"http://" + url.netloc + url.raw_path  # forwarded: the whole URL
        parts = [request.method.encode(), b" ", target, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            parts += [name, b": ", value, b"\r\n"]
        if proxy is not None and url.raw_scheme == b"http" and proxy.authorization:
            parts += [b"proxy-authorization: ", proxy.authorization.encode(), b"\r\n"]
        parts.append(b"\r\n")
        if isinstance(request.stream, httpx.ByteStream):
            content = request.content
        else:
            content = b"".join([chunk async for chunk in request.stream])  # type: ignore[union-attr]
        parts.append(content)
        await send_request(conn, b"".join(parts), timeouts.get("write"), request)
        read_timeout = timeouts.get("read")
        accepted = request.headers.get("accept-encoding", "identity").strip().lower()
        status, reason, headers, keep_alive, length, chunked = await read_head(
            conn, read_timeout, request, head_request=request.method == "HEAD",
            accepts_coding=accepted not in ("", "identity"))
        if request.headers.get("connection", "").lower() == "close":
            keep_alive = False
        body = UpstreamBody(self, conn, request, length=length, chunked=chunked,
                            keep_alive=keep_alive, read_timeout=read_timeout,
                            limit=self.max_body_bytes)
        return httpx.Response(
            status,
            headers=headers,
            stream=body,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def release(self, conn: UpstreamConnection, *, reuse: bool) -> None:
        self._slots.release()
        if reuse and not conn.buffer:
            stack = self._idle.setdefault(cast("PoolKey", conn.origin), [])
            if len(stack) < self._max_idle:
                conn.idle_since = trio.current_time()
                stack.append(conn)
                return
        conn.buffer.clear()  # in place: a reader's frame may still refer to it
        await conn.close()

    async def post(
        self, url: str, *, headers: Mapping[str, str], content: bytes, timeout_s: float,
        egress: Egress = DIRECT,
    ) -> tuple[int, bytes]:
        """POST ``content`` and read the whole answer: ``(status, body)``.

        The hot path of a non-streamed upstream call, without httpx's request and
        response objects: the head up to ``Content-Length`` is built once per (url,
        headers) and kept, the request asks for no content coding (so the body is as
        sent). ``timeout_s`` bounds the whole call (one deadline; connecting at most
        :data:`CONNECT_TIMEOUT_S` of it). Errors are httpx's (a timeout:
        ``httpx.TimeoutException``, or ``ConnectTimeout``).
        """
        prefix = self._prefix(url, headers, egress)
        # A bare scope, not fail_after (a generator context manager around the same scope).
        with trio.CancelScope(deadline=trio.current_time() + timeout_s):
            return await self._post(prefix, content, timeout_s)
        raise httpx.TimeoutException(f"upstream call took over {timeout_s} s")

    async def open_stream(
        self, url: str, *, headers: Mapping[str, str], content: bytes, timeout_s: float,
        egress: Egress = DIRECT,
    ) -> httpx.Response:
        """POST ``content`` and return the response once its head is read; its body
        (``stream``, a transport body: ``read_some``) is read by the caller, who must
        close the response.

        The hot path of a streamed upstream call, as :meth:`post` is of a whole one:
        no ``httpx.Request``, no URL parsing per call (the head up to
        ``Content-Length`` is kept per url and headers), no cookie or redirect layers;
        the request asks for no content coding. ``timeout_s`` bounds the wait for a
        connection slot, the connect (at most :data:`CONNECT_TIMEOUT_S`), the write,
        and then each read, body reads included (httpx's ``read`` timeout), and the whole
        stream: no body read is made ``timeout_s`` after the call began, and a wait ends
        then (a stream that trickles is ended as one that went silent). Errors are
        httpx's (a timeout: ``httpx.TimeoutException``; the slot: ``PoolTimeout``).
        """
        deadline = trio.current_time() + timeout_s
        origin, proxy, head = self._prefix(url, headers, egress)
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
        conn: UpstreamConnection | None = None
        try:
            conn = self._pop_idle(origin)
            if conn is None:
                conn = await self._connect(origin, proxy, None,
                                           min(timeout_s, CONNECT_TIMEOUT_S))
            await send_request(conn, b"".join((head, b"content-length: %d\r\n\r\n" % len(content),
                                        content)), timeout_s, None)
            status, reason, raw_headers, keep_alive, length, chunked = await read_head(
                conn, max(0.0, min(timeout_s, deadline - trio.current_time())), None,
                head_request=False)
        except BaseException:
            self._slots.release()  # first: a cancelled close re-raises Cancelled
            if conn is not None:
                await conn.close()
            raise
        # ``__aiter__`` (an error status's body, httpx's iterators) is bounded as a whole
        # body is; ``read_some`` (the stream) by the event bound and the deadline.
        body = UpstreamBody(self, conn, None, length=length, chunked=chunked,
                            keep_alive=keep_alive, read_timeout=timeout_s,
                            limit=self.max_body_bytes, deadline=deadline)
        return httpx.Response(status, headers=raw_headers, stream=body,
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason})

    def _prefix(self, url: str, headers: Mapping[str, str], egress: Egress
                ) -> tuple[PoolKey, Proxy | None, bytes]:
        key = (url, tuple(headers.items()), egress)
        prefix = self._prefixes.get(key)
        if prefix is None:
            if len(self._prefixes) >= _MAX_PREFIXES:
                self._prefixes.clear()
            scheme, host, port = httpx_origin(url)
            pool_key = (scheme, host, port, egress)
            proxy = self._proxy(pool_key)
            _, head = _post_prefix(url, headers, proxy)
            prefix = self._prefixes[key] = (pool_key, proxy, head)
        return prefix

    async def _post(
        self, prefix: tuple[PoolKey, Proxy | None, bytes], content: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        origin, proxy, head = prefix
        # A free slot without Semaphore.acquire's scheduler pass: the read of the answer
        # below waits, and is the call's checkpoint. Cancellation is still checked before
        # anything is sent (a request the upstream sees may be billed).
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
        conn: UpstreamConnection | None = None
        handed = False  # the slot and the connection belong to an UpstreamBody
        try:
            conn = self._pop_idle(origin)
            if conn is None:
                conn = await self._connect(origin, proxy, None,
                                           min(timeout_s, CONNECT_TIMEOUT_S))
            await send_request(conn, b"".join((head, b"content-length: %d\r\n\r\n" % len(content),
                                        content)), None, None)
            status, _, _, keep_alive, length, chunked = await read_head(
                conn, None, None, head_request=False)
            if length is None:  # chunked, or up to the connection's end
                body = UpstreamBody(self, conn, None, length=None, chunked=chunked,
                                    keep_alive=keep_alive, read_timeout=None,
                                    limit=self.max_body_bytes)
                handed = True
                chunks: list[bytes] = []
                try:
                    async for chunk in body:
                        chunks.append(chunk)
                except BaseException:
                    chunks.clear()  # an error's frames must not keep the body alive
                    raise
                finally:
                    await body.aclose()
                return status, b"".join(chunks)
            content = await read_exactly(conn, length, self.max_body_bytes)
        except BaseException:
            if not handed:
                self._slots.release()  # first: a cancelled close re-raises Cancelled
                if conn is not None:
                    await conn.close()
            raise
        await self.release(conn, reuse=keep_alive)
        return status, content

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for stack in idle.values():
            for conn in stack:
                await conn.close()
