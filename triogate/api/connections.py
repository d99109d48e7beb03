"""Client connections: closed as soon as the client closes, and a request that stops
arriving is timed out.

hypercorn's trio server (0.18) reads a connection in one loop next to a keep-alive task.
Two gaps, both seen from outside (``ss -tan``):

* When the client closes an idle kept-alive connection, the read loop ends but the
  connection's task group still waits for the keep-alive task: the socket sits in
  CLOSE-WAIT for up to ``keep_alive_timeout`` (75 s), one file descriptor each. Under a
  128-fd limit, 200 one-shot clients exhausted the process.
* Without ``read_timeout`` a client that stops in the middle of its request (head or body)
  holds its connection and its request task forever; with hypercorn's ``read_timeout``
  every read is bounded, including the ones during a long streamed response, when the
  client rightly sends nothing, so a stream would be cut as if the client had left.

:func:`install` replaces the read loop: it stops the keep-alive task the moment the
client's side is closed (the socket is closed once the request in flight, if any, has
seen its ``http.disconnect``), and bounds each read by ``body_read_timeout_s`` only while
a request is partly received. A request that times out is answered 408 in the OpenAI
error shape (when no response has started) and the connection is closed. The swap is
idempotent, as :mod:`triogate.api.protocol_errors`'s.

It also replaces each connection's keep-alive timer (:class:`IdleTimer`). hypercorn's
(``TrioSingleTask``) starts a task, a timeout scope and a wait whenever the connection
turns idle and cancels them when the next request starts: two task switches, a lock and
a ``Cancelled`` unwinding per request, a tenth of a worker's CPU at 256 connections.
:class:`IdleTimer` keeps one task per connection and moves its deadline instead.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import h11
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

from triogate.api.h11_writes import CachedDate

_DATE = CachedDate()


class GatewayHttpConfig(HypercornConfig):
    """hypercorn's settings plus the gap a partly received request may leave between reads;
    its per-response headers with the ``date`` formatted once a second."""

    body_read_timeout_s: float | None = 30.0

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        if self.alt_svc_headers or self._quic_addresses:
            return super().response_headers(protocol)
        headers = []
        if self.include_date_header:
            headers.append((b"date", _DATE()))
        if self.include_server_header:
            headers.append((b"server", b"hypercorn-" + protocol.encode("ascii")))
        return headers


def mid_request(protocol: Any) -> bool:
    """Whether an HTTP/1 connection holds part of a request (head or body) and waits for more."""
    inner = getattr(protocol, "protocol", None)
    if not isinstance(inner, H11Protocol):
        return False
    connection = inner.connection
    if not isinstance(connection, h11.Connection):
        return False  # a WebSocket
    state = connection.their_state
    if state is h11.SEND_BODY:
        return True
    return state is h11.IDLE and bool(connection.trailing_data[0])


async def _timed_out(server: Any) -> None:
    """Answer 408 if nothing was answered yet; the caller then closes the connection."""
    inner = getattr(server.protocol, "protocol", None)
    if isinstance(inner, H11Protocol) and inner.connection.our_state in (
            h11.IDLE, h11.SEND_RESPONSE):
        with contextlib.suppress(h11.LocalProtocolError):  # a response started meanwhile
            await inner._send_error_response(408)


class IdleTimer:
    """A connection's keep-alive timer: one task for the connection's life.

    Same behaviour as hypercorn's: ``keep_alive_timeout`` seconds idle, or the server
    shutting down while (or once) the connection is idle, close it. ``restart`` (idle) and
    ``stop`` (a request started) only move the deadline of the task's scope; ``close``
    (the read loop ended) ends the task.
    """

    def __init__(self, server: Any) -> None:
        self._server = server
        self._scope: trio.CancelScope | None = None
        self._idle = False
        self._closed = False
        self._became_idle: trio.Event | None = None

    async def restart(self, task_group: Any, action: Any) -> None:
        self._idle = True
        deadline = trio.current_time() + self._server.config.keep_alive_timeout
        if self._scope is None:
            self._scope = trio.CancelScope(deadline=deadline)
            task_group._nursery.start_soon(self._watch, self._scope)
        else:
            self._scope.deadline = deadline
        if self._became_idle is not None:
            self._became_idle.set()

    async def stop(self) -> None:
        self._idle = False
        if self._scope is not None:
            self._scope.deadline = math.inf

    def close(self) -> None:
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()

    async def _watch(self, scope: trio.CancelScope) -> None:
        with scope:
            await self._server.context.terminated.wait()
            while not self._idle:  # shutting down: close once the request in flight ends
                self._became_idle = trio.Event()
                await self._became_idle.wait()
        if self._closed:
            return
        with trio.CancelScope(shield=True):
            await self._server._initiate_server_close()


async def _read_data(self: Any) -> None:
    timeout = getattr(self.config, "body_read_timeout_s", None)
    while True:
        try:
            if timeout and mid_request(self.protocol):
                with trio.fail_after(timeout):
                    data = await self.stream.receive_some(MAX_RECV)
            else:  # idle, or a response going out: the keep-alive timer bounds it
                data = await self.stream.receive_some(MAX_RECV)
        except trio.TooSlowError:
            await _timed_out(self)
            break
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            break
        else:
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
    # Nothing more can arrive: the keep-alive wait has nothing left to keep alive.
    if isinstance(self.idle_task, IdleTimer):
        self.idle_task.close()
    else:
        await self.idle_task.stop()
    await self.protocol.handle(Closed())


def install() -> None:
    """Give hypercorn's trio TCP server the read loop and the keep-alive timer above."""
    TCPServer._read_data = _read_data  # type: ignore[method-assign]
    if getattr(TCPServer.__init__, "_triogate", False):
        return
    original = TCPServer.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.idle_task = IdleTimer(self)

    __init__._triogate = True  # type: ignore[attr-defined]
    TCPServer.__init__ = __init__  # type: ignore[method-assign]
