"""The listening socket, the accept loop, and shutdown.

One nursery owns every connection task. Shutdown: stop accepting and close the listening
socket; close idle connections at once (their timer's deadline moves to now); a connection
busy with a request closes once its answer is out; after ``shutdown_grace_s`` whatever is
left is cancelled. Then :func:`serve` returns, so the caller can drain what the requests
left behind (the gateway's settler).

``max_connections`` keeps the server inside its descriptors: past the process's open-files
limit ``accept`` fails, and so does everything else that opens one (the gateway's upstream
connections, its Redis pool, SQLite), which would turn a flood of clients into errors for
the requests already admitted. At the bound the server does what nginx does when its
``worker_connections`` run out: it closes an idle kept-alive connection (its client
reconnects, as after the keep-alive), and with none idle it stops accepting until a
connection closes; the kernel's listen queue holds the newcomers meanwhile.

The ASGI lifespan protocol is not run: the gateway's parts live in the nursery that calls
:func:`serve` (``triogate.app.open_gateway``), so there is nothing for it to start.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket
from typing import TYPE_CHECKING

import trio

from triogate.server._connection import Connection
from triogate.server._head import CachedDate
from triogate.server._idle import IdleWatchdog

if TYPE_CHECKING:
    from triogate.server._config import ServerConfig
    from triogate.server._connection import App

logger = logging.getLogger("triogate.server")

#: Connections accepted per wake-up before the loop yields to the others.
_ACCEPT_BATCH = 64
#: Accept errors that mean "out of descriptors or memory": wait a little, then retry.
_RESOURCE_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: At ``max_connections``, how often the idle connections are looked for again.
_ROOM_POLL_S = 0.1
#: "max_connections reached" is logged at most this often.
_FULL_LOG_INTERVAL_S = 60.0


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A bound listening TCP socket (``SO_REUSEADDR``; IPv6 if ``host`` is one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


def url_of(sock: socket.socket) -> str:
    """``http://host:port`` of a listening socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server:
    def __init__(self, app: App, config: ServerConfig, listener: socket.socket) -> None:
        self.app = app
        self.config = config
        self.listener = listener
        self.connections: set[Connection] = set()
        self.closing = False
        self.drained = trio.Event()
        self.date = CachedDate()
        #: Closes connections idle past the keep-alive (its task runs in serve's nursery).
        self.idle = IdleWatchdog(config.keep_alive_s)
        name = listener.getsockname()
        self.address = (str(name[0]), int(name[1]))
        #: Connections accepted and not yet closed (``connections`` fills a step later).
        self.open = 0
        #: Set when a connection closes while the accept loop waits for room.
        self._room: trio.Event | None = None
        self._full_logged_at = -math.inf

    async def accept(self, nursery: trio.Nursery) -> None:
        listener = self.listener
        cap = self.config.max_connections
        while True:
            await trio.lowlevel.wait_readable(listener)
            if cap is not None and self.open >= cap:  # a newcomer waits: make room first
                await self._make_room()
                continue
            for _ in range(_ACCEPT_BATCH):
                if cap is not None and self.open >= cap:
                    break
                try:
                    sock, _addr = listener.accept()
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno in _RESOURCE_ERRORS:
                        logger.warning("accept failed: %s", exc)
                        await trio.sleep(0.1)
                    break  # ECONNABORTED and the like: that client is gone
                self.open += 1
                nursery.start_soon(self.connection, sock)
            await trio.lowlevel.checkpoint()

    async def _make_room(self) -> None:
        """At ``max_connections``: close an idle kept-alive connection, or wait until one
        closes or, at most ``_ROOM_POLL_S`` later, look again (a busy one may have gone
        idle: a connection does not report that, so as to cost its requests nothing)."""
        now = trio.current_time()
        if now - self._full_logged_at >= _FULL_LOG_INTERVAL_S:
            self._full_logged_at = now
            logger.warning("%d client connections open (max_connections): closing idle "
                           "ones, new clients wait in the listen queue", self.open)
        room = self._room = trio.Event()
        # A connection that has not sent its first request yet is a newcomer, not idle.
        for conn in self.connections:
            if conn.idle and conn.served and not conn.closing:
                conn.closing = True
                conn.timer.deadline = -math.inf
                break
        with trio.move_on_after(_ROOM_POLL_S):
            await room.wait()

    async def connection(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(sock, self.app, self.config, self.address, self.date)
        conn.closing = self.closing
        self.connections.add(conn)
        self.idle.watch(conn)
        try:
            await conn.run()
        except Exception:  # a bug here must cost one connection, never the server
            logger.exception("connection failed")
        finally:
            conn.closed = True
            self.open -= 1
            self.connections.discard(conn)
            sock.close()
            if self._room is not None:
                self._room.set()
                self._room = None
            if self.closing and not self.connections:
                self.drained.set()

    def close_idle(self) -> None:
        """Shutdown: every connection stops after its request; idle ones stop now."""
        self.closing = True
        for conn in self.connections:
            conn.closing = True
            if conn.idle:
                conn.timer.deadline = -math.inf
        if not self.connections:
            self.drained.set()


async def serve(
    app: App,
    config: ServerConfig,
    *,
    shutdown: trio.Event,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` (ASGI 3, HTTP only) until ``shutdown`` is set; return once the
    connections are closed (or ``config.shutdown_grace_s`` has passed and they were
    cancelled).

    Args:
        app: the ASGI application.
        config: timeouts and limits.
        shutdown: set it to stop.
        host, port: where to listen (port 0: any free port), unless ``sock`` is given.
        sock: a listening socket to accept on (``--workers``: inherited from the
            supervisor); it is listened on again with ``config.backlog``.
        task_status: started with the listening URLs once accepting.
    """
    listener = sock if sock is not None else listen(host, port, config.backlog)
    if sock is not None:
        sock.listen(config.backlog)
    listener.setblocking(False)
    server = _Server(app, config, listener)
    urls = [url_of(listener)]
    accepting = trio.CancelScope()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.idle.run)
            nursery.start_soon(_accept_until, server, nursery, accepting)
            logger.info("Running on %s (CTRL + C to quit)", urls[0])
            task_status.started(urls)
            await shutdown.wait()
            accepting.cancel()
            _close(listener)  # new clients are refused now, not queued
            server.close_idle()
            with trio.move_on_after(config.shutdown_grace_s):
                await server.drained.wait()
            nursery.cancel_scope.cancel()
    finally:
        _close(listener)


async def _accept_until(server: _Server, nursery: trio.Nursery, scope: trio.CancelScope) -> None:
    with scope:
        await server.accept(nursery)


def _close(listener: socket.socket) -> None:
    if listener.fileno() != -1:
        trio.lowlevel.notify_closing(listener)
        listener.close()
