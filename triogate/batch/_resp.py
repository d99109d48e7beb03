"""RespBackend: a pipelined RESP2 client on Trio sockets, parsed by hiredis.

Why not coredis for a single server: on Trio, a 10-command coredis pipeline costs about
470 µs and a lone GET about 370 µs, against about 105 µs and 85 µs for this client on
the same unix socket (see bench/). The gateway's promise is about waits, and each wait's
fixed cost is what this client removes.

Invariants:
    * A connection is used by one pipeline at a time and returns to the idle list only
      after every reply was read. Anything else (error, timeout, cancellation) closes it,
      so a half-read reply can never be mistaken for the next pipeline's.
    * Every ``execute`` is bounded by ``command_timeout_s`` (pool wait, connect, send and
      read together) and fails with :class:`BackendUnavailable`, never hangs. On a pooled
      plain socket with a free slot (the common case) the run's watchdog
      (``_watchdog.py``) enforces it; anything that waits for more than the socket (a pool
      slot, a new connection, TLS) runs in a deadline scope.
    * A pooled connection is checked before reuse: one idle for longer than
      ``max_idle_s`` is closed (a NAT or firewall may have dropped its flow without a
      word), and one whose socket is readable while idle is closed too (the server
      closed it: its ``timeout``, ``CLIENT KILL``, a restart; a poll, no round trip).
    * A *reused* connection that fails before a single reply byte arrived (the send
      failed, or EOF/reset before any reply) is retried once on a fresh connection,
      within the same ``command_timeout_s``: a stale connection costs no failed round.
      Once a reply byte arrived nothing is retried (the server was executing). A
      command sent on a connection the server then closed unread may in rare races
      have been executed: every write the gateway sends is idempotent by request id.
"""

from __future__ import annotations

import math
import os
import select
import socket
import struct
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, final

import attrs
import hiredis
import trio

from ._backend import RedisAddress, TlsOptions, redact_url
from ._errors import BackendUnavailable, CommandError
from ._fusion import Fuser
from ._watchdog import Watchdog, Watched, current, watchdog

#: ``SO_LINGER`` on, 0 s: ``close`` resets the connection and drops unsent data.
_RESET = struct.pack("ii", 1, 0)

if TYPE_CHECKING:
    import ssl
    from collections.abc import AsyncIterator, Sequence

    from ._backend import Wire

_RECEIVE_BYTES = 65536


@final
@attrs.frozen(kw_only=True)
class BackendStatistics:
    """Counters of one backend since it was created."""

    pipelines: int
    commands: int
    failures: int
    connections_open: int
    connections_idle: int
    #: Pooled connections closed before reuse (idle too long, or closed by the server).
    stale_discarded: int = 0
    #: Pipelines re-sent on a fresh connection after a reused one failed unread.
    stale_retries: int = 0


_DISCONNECTED = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


class _TimedOut(Exception):
    """The watchdog fired on the pipeline's connection."""


class _Connection(Watched):
    """One socket and its reply parser (and, on a plain socket, the watchdog's flags)."""

    __slots__ = ("dog", "idle_since", "poll", "reader", "received", "stream")

    def __init__(self, stream: trio.abc.Stream, timeout_s: float) -> None:
        #: ``fd``: the socket's descriptor for plain TCP and unix sockets (-1 under TLS):
        #: the round trip writes and reads it directly (see :meth:`roundtrip`).
        super().__init__(
            stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1, timeout_s
        )
        self.stream = stream
        #: A poll set of the plain socket alone, made once: :meth:`looks_closed` runs
        #: before every reuse, and trio's ``is_readable`` builds and fills a new one each
        #: time (2.5 µs against 0.8 µs for the same ``poll`` system call).
        self.poll: select.poll | None = None
        if self.fd >= 0:
            self.poll = select.poll()
            self.poll.register(self.fd, select.POLLIN)
        #: The watchdog of the trio run that watches this connection (None: none does).
        self.dog: Watchdog | None = None
        self.reader = hiredis.Reader(replyError=CommandError)
        #: Trio time this connection went back to the pool.
        self.idle_since = 0.0
        #: Whether the last roundtrip got any reply byte.
        self.received = False

    async def roundtrip(self, packed: bytes, count: int) -> list[object]:
        """Send ``packed``, read ``count`` replies. A checkpoint.

        On a plain socket the pipeline is written with one ``write`` (what the kernel did
        not take follows after ``wait_writable``) and replies are read after
        ``wait_readable``: trio's socket methods wrap each call in an async context
        manager and a scheduler pass even when it succeeds at once, and a pipeline's
        reply is never there before it is sent, so the read waits anyway. For the same
        reason the first read waits before it reads: a ``read`` right after the write
        met ``EAGAIN`` every time (a system call and an exception per pipeline).

        The watchdog (``_watchdog.py``) wakes a wait on this socket when it fires; a
        firing that found no wait (the task was runnable) is seen by the ``fired`` check
        before each wait. So every wait here is on the socket itself, never through the
        stream's ``send_all``, whose scheduler pass between two sends the watchdog could
        fire in, leaving the next wait unbounded.
        """
        self.received = False
        fd = self.fd
        if fd < 0:
            await self.stream.send_all(packed)
        else:
            try:
                sent = os.write(fd, packed)
            except BlockingIOError:
                sent = 0
            if sent < len(packed):
                rest = memoryview(packed)
                while sent < len(packed):
                    if self.fired:
                        raise _TimedOut
                    await trio.lowlevel.wait_writable(fd)
                    with suppress(BlockingIOError):
                        sent += os.write(fd, rest[sent:])
        waited = False
        replies: list[object] = []
        reader = self.reader
        while len(replies) < count:
            reply = reader.gets()
            if reply is False:
                if fd < 0:
                    data = bytes(await self.stream.receive_some(_RECEIVE_BYTES))
                    waited = True
                else:
                    if not waited:
                        if self.fired:  # before each wait: notify_closing wakes waits only
                            raise _TimedOut
                        await trio.lowlevel.wait_readable(fd)
                        waited = True
                    try:
                        data = os.read(fd, _RECEIVE_BYTES)
                    except BlockingIOError:
                        if self.fired:
                            raise _TimedOut from None
                        await trio.lowlevel.wait_readable(fd)
                        continue
                if not data:
                    raise trio.BrokenResourceError("server closed the connection")
                self.received = True
                reader.feed(data)
                continue
            replies.append(reply)
        if not waited:  # a schedule point that cannot lose the replies, as recv's is
            await trio.lowlevel.cancel_shielded_checkpoint()
        return replies

    def looks_closed(self) -> bool:
        """Whether the idle socket is readable: EOF, a reset, or bytes nobody asked for
        (a server says goodbye so). Sync: one ``poll`` with a zero timeout."""
        if self.poll is not None:
            try:
                return bool(self.poll.poll(0))
            except OSError:
                return True
        stream = self.stream
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if isinstance(stream, trio.SocketStream):
            try:
                return stream.socket.is_readable()
            except OSError:
                return True
        return False

    def close_nowait(self, *, abort: bool = False) -> None:
        """Close synchronously: usable in ``finally`` blocks under cancellation.

        ``abort``: the pipeline on it was given up (timeout, error, cancellation): reset
        the connection (``SO_LINGER`` 0) so that the kernel drops what it has not yet
        delivered instead of sending it on. Otherwise a script written into a partition
        would reach Redis when the link heals, after the gateway had already settled the
        request as never admitted, and hold a reservation until its lease ran out.
        """
        self.closed = True  # the watchdog forgets it
        stream = self.stream
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if isinstance(stream, trio.SocketStream):
            if abort:
                with suppress(OSError):
                    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            stream.socket.close()


@final
class RespBackend:
    """A connection pool to one Redis-compatible server, sending whole pipelines.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL.
        name: label for traces and errors.
        pool_size: most connections open at once; more concurrent pipelines wait.
        command_timeout_s: bound on one ``execute`` (pool wait + connect + round trip).
        max_idle_s: a pooled connection idle for longer is closed instead of reused.
        fuse_scripts: send the script calls of one pipeline as one fused ``EVALSHA``
            (``_fusion.py``); False sends one ``EVALSHA`` per call.
        tls: the SSL context holder for a ``rediss://`` URL, to share one among the
            nodes of a deployment; default: one of its own, from the URL's options.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "redis",
        pool_size: int = 32,
        command_timeout_s: float = 0.5,
        max_idle_s: float = 30.0,
        fuse_scripts: bool = True,
        tls: TlsContext | None = None,
    ) -> None:
        self._address = RedisAddress.from_url(url)
        #: The SSL context of a ``rediss://`` URL (None: plain TCP or a unix socket).
        self._tls: TlsContext | None = None
        if self._address.tls:
            self._tls = tls if tls is not None else TlsContext(self._address.tls_options)
        self._fuser = Fuser() if fuse_scripts else None
        self._max_idle_s = max_idle_s
        self._stale = 0
        self._retries = 0
        self._url = redact_url(url)
        self._name = name
        self._timeout_s = command_timeout_s
        #: Pooled plain sockets are bounded by the run's watchdog (a positive bound).
        self._watched = command_timeout_s > 0
        self._slots = trio.Semaphore(pool_size)
        self._idle: list[_Connection] = []
        self._open = 0
        self._pipelines = 0
        self._commands = 0
        self._failures = 0
        self._closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def script_fuser(self) -> Fuser | None:
        """How the flush fuses this backend's script calls: all of a pipeline's at once."""
        return self._fuser

    @property
    def url(self) -> str:
        """The server's URL, password redacted."""
        return self._url

    def __repr__(self) -> str:
        return f"RespBackend({self._name!r}, {self._url!r})"

    async def execute(self, commands: Sequence[Wire]) -> list[object]:
        if not commands:
            await trio.lowlevel.checkpoint()
            return []
        packed = b"".join([hiredis.pack_command(c) for c in commands])  # type: ignore[arg-type]
        self._pipelines += 1
        self._commands += len(commands)
        count = len(commands)
        started = trio.current_time()
        try:
            # Cancellation is checked before the pipeline leaves (a script the server ran
            # must be one its owner saw); the round trip is the schedule point.
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                self._slots.acquire_nowait()
            except trio.WouldBlock:
                return await self._bounded(started, packed, count, have_slot=False)
            try:
                conn = self._take_idle(started)
                if conn is None or conn.dog is None or conn.dog is not current():
                    return await self._bounded(started, packed, count, reuse=conn)
                # The common case: only the socket can make it wait, the watchdog bounds it.
                conn.since = started
                try:
                    return await self._use(conn, packed, count)
                except _DISCONNECTED:
                    if conn.fired:
                        raise _TimedOut from None
                    if conn.received:
                        raise  # the server was answering: it may have executed; not ours
                # The reused connection died before any reply: the server closed it while
                # idle. Retried once on a fresh one, within the same bound.
                self._retries += 1
                return await self._bounded(started, packed, count)
            finally:
                self._slots.release()
        except _TimedOut:
            pass
        except _DISCONNECTED as exc:
            self._failures += 1
            raise BackendUnavailable(self._name, _reason(exc)) from exc
        except hiredis.ProtocolError as exc:
            self._failures += 1
            raise BackendUnavailable(self._name, f"protocol error: {exc}") from exc
        self._failures += 1
        raise BackendUnavailable(self._name, f"no reply within {self._timeout_s} s")

    async def _bounded(
        self,
        started: float,
        packed: bytes,
        count: int,
        *,
        have_slot: bool = True,
        reuse: _Connection | None = None,
    ) -> list[object]:
        """What may wait for more than a pooled socket (a pool slot, a new connection, a
        TLS stream), under a deadline scope ending when the pipeline's bound does.

        Raises:
            _TimedOut: the bound passed.
        """
        with trio.CancelScope(deadline=started + self._timeout_s):
            if have_slot:
                return await self._send(packed, count, reuse)
            await self._slots.acquire()
            try:
                return await self._send(packed, count, self._take_idle(trio.current_time()))
            finally:
                self._slots.release()
        raise _TimedOut

    async def _send(self, packed: bytes, count: int, conn: _Connection | None) -> list[object]:
        """Round trip on ``conn`` (a pooled connection) or, if None, a new one."""
        if conn is None:
            return await self._use(await self._connect(), packed, count)
        try:
            return await self._use(conn, packed, count)
        except _DISCONNECTED:
            if conn.received:
                raise  # the server was answering: it may have executed; not ours to retry
        # The reused connection died before any reply: the server closed it while idle.
        self._retries += 1
        return await self._use(await self._connect(), packed, count)

    async def _use(self, conn: _Connection, packed: bytes, count: int) -> list[object]:
        ok = False
        try:
            replies = await conn.roundtrip(packed, count)
            ok = True
            return replies
        finally:
            conn.since = math.inf
            # A watchdog that fired as the last reply came in closed it for good: the
            # replies stand (data wins, as over a scope cancelled too late).
            if ok and not self._closed and not conn.fired:
                conn.idle_since = trio.current_time()
                self._idle.append(conn)
            else:
                self._open -= 1
                conn.close_nowait(abort=not ok)

    def _take_idle(self, now: float) -> _Connection | None:
        """The most recently used live idle connection; drops stale ones (sync)."""
        idle = self._idle
        # The oldest sit at the front: expire them first, whoever asks.
        while idle and now - idle[0].idle_since > self._max_idle_s:
            self._discard(idle.pop(0))
        while idle:
            conn = idle.pop()
            if not conn.looks_closed():
                return conn
            self._discard(conn)
        return None

    def _discard(self, conn: _Connection) -> None:
        self._stale += 1
        self._open -= 1
        conn.close_nowait()

    async def _connect(self) -> _Connection:
        stream = await _open_stream(self._address, self._tls)
        conn = _Connection(stream, self._timeout_s)
        self._open += 1
        try:
            setup = _setup_commands(self._address)
            if setup:
                for reply in await conn.roundtrip(
                    b"".join(hiredis.pack_command(c) for c in setup),  # type: ignore[arg-type]
                    len(setup),
                ):
                    if isinstance(reply, CommandError):
                        raise BackendUnavailable(self._name, f"connection setup: {reply.reply}")
        except BaseException:
            self._open -= 1
            conn.close_nowait()
            raise
        if conn.fd >= 0 and self._watched:
            conn.dog = watchdog()
            conn.dog.watch(conn)
        return conn

    @asynccontextmanager
    async def open_subscription(self, *channels: str) -> AsyncIterator[Subscription]:
        """A dedicated connection subscribed to ``channels``; closed on exit.

        Reads on it are not bounded by ``command_timeout_s`` (they wait for messages);
        a lost connection ends iteration with :class:`BackendUnavailable`.
        """
        try:
            with trio.fail_after(self._timeout_s):
                conn = await self._connect()
                try:
                    await conn.stream.send_all(
                        hiredis.pack_command(("SUBSCRIBE", *channels))  # type: ignore[arg-type]
                    )
                except BaseException:
                    # Not handed to the caller: close it here (the watchdog forgets a
                    # closed connection; it would otherwise keep the socket alive).
                    self._open -= 1
                    conn.close_nowait()
                    raise
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
            raise BackendUnavailable(self._name, f"subscribe: {exc!r}") from exc
        try:
            yield Subscription(conn, self._name)
        finally:
            self._open -= 1
            conn.close_nowait()

    def statistics(self) -> BackendStatistics:
        """Counters since creation; cheap, sync."""
        return BackendStatistics(
            pipelines=self._pipelines,
            commands=self._commands,
            failures=self._failures,
            connections_open=self._open,
            connections_idle=len(self._idle),
            stale_discarded=self._stale,
            stale_retries=self._retries,
        )

    async def aclose(self) -> None:
        """Close idle connections; connections in use close when their pipeline ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._open -= 1
            conn.close_nowait()
        await trio.lowlevel.checkpoint()


@final
class Subscription:
    """Messages from a ``SUBSCRIBE`` connection, as ``(channel, data)`` pairs."""

    def __init__(self, conn: _Connection, backend: str) -> None:
        self._conn = conn
        self._backend = backend

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> tuple[bytes, bytes]:
        reader = self._conn.reader
        try:
            while True:
                reply = reader.gets()
                if reply is False:
                    data = await self._conn.stream.receive_some(_RECEIVE_BYTES)
                    if not data:
                        raise trio.BrokenResourceError("server closed the connection")
                    reader.feed(bytes(data))
                    continue
                if isinstance(reply, list) and len(reply) == 3 and reply[0] == b"message":
                    return reply[1], reply[2]
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise BackendUnavailable(self._backend, f"subscription lost: {exc!r}") from exc


@final
class TlsContext:
    """The SSL context of a ``rediss://`` deployment, made on first use in a worker thread
    (it reads certificate files) and shared by every connection (and node) after that."""

    def __init__(self, options: TlsOptions) -> None:
        self._options = options
        self._context: ssl.SSLContext | None = None

    async def get(self) -> ssl.SSLContext:
        """The context. Raises :class:`OSError`/:class:`ssl.SSLError` for a bad file."""
        if self._context is None:
            self._context = await trio.to_thread.run_sync(self._options.context)
        return self._context


async def _open_stream(address: RedisAddress, tls: TlsContext | None) -> trio.abc.Stream:
    if address.unix_path is not None:
        return await trio.open_unix_socket(address.unix_path)
    assert address.host is not None
    if tls is not None:
        context = await tls.get()
        stream = await trio.open_ssl_over_tcp_stream(address.host, address.port,
                                                     ssl_context=context)
        # The handshake now, inside the connect's bound: a refused certificate is a
        # connection failure, not a failure of the first pipeline's send.
        await stream.do_handshake()
        return stream
    return await trio.open_tcp_stream(address.host, address.port)


def _reason(exc: BaseException) -> str:
    """``Type: message`` of a lost connection, with the cause trio wraps (a refused TLS
    handshake is a ``BrokenResourceError`` from an ``SSLError``)."""
    reason = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None and isinstance(exc, trio.BrokenResourceError):
        reason += f"({type(cause).__name__}: {cause})"
    return reason


def _setup_commands(address: RedisAddress) -> list[Wire]:
    setup: list[Wire] = []
    if address.password is not None:
        if address.username:
            setup.append(("AUTH", address.username, address.password))
        else:
            setup.append(("AUTH", address.password))
    if address.db:
        setup.append(("SELECT", address.db))
    return setup
