"""Fewer writes per HTTP/1 response: the head leaves with the body, empty writes don't.

hypercorn's HTTP/1 protocol writes every h11 event on its own: the status line and
headers, then the body, then the end of the message (``b""`` for a body framed by
``Content-Length``). Each write takes the connection's send lock, a shielded cancel scope
and a ``send`` system call, so a small JSON answer cost three of each. :func:`install`
makes the final response head wait for what follows it (the body, the end of the
message, or the stream's end) and go out in the same write, and skips empty writes. An
answer that starts streaming sends its head with its first chunk, at the same moment
as before (the gateway sends a stream's status line only with its first chunk).

Also: hypercorn formats the ``date`` header on every response; :class:`CachedDate`
formats it once a second (the header's resolution).
"""

from __future__ import annotations

import time
from typing import Any
from wsgiref.handlers import format_date_time

import h11
from hypercorn.events import RawData
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h11 import H11Protocol

_PENDING = "_triogate_pending_head"


async def _send_h11_event(self: Any, event: Any) -> None:
    try:
        data = self.connection.send(event)
    except h11.LocalProtocolError:
        if self.connection.their_state != h11.ERROR:
            raise
        return
    pending = self.__dict__.pop(_PENDING, None)
    if pending is not None:
        data = pending + data
    if type(event) is h11.Response:  # a final head: it leaves with what follows
        setattr(self, _PENDING, data)
        return
    if data:
        await self.send(RawData(data=data))


async def flush(protocol: Any) -> None:
    """Write a response head still waiting for its body (the stream ended without one)."""
    pending = protocol.__dict__.pop(_PENDING, None)
    if pending:
        await protocol.send(RawData(data=pending))


def _wrap_stream_send(original: Any) -> Any:
    async def stream_send(self: Any, event: Any) -> None:
        if isinstance(event, StreamClosed):
            await flush(self)
        await original(self, event)

    stream_send._triogate = True  # type: ignore[attr-defined]
    return stream_send


class CachedDate:
    """The ``date`` response header, formatted at most once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._value = format_date_time(now).encode("ascii")
            self._second = now
        return self._value


def install() -> None:
    """Give hypercorn's HTTP/1 protocol the write path above (idempotent)."""
    H11Protocol._send_h11_event = _send_h11_event  # type: ignore[method-assign]
    if not getattr(H11Protocol.stream_send, "_triogate", False):
        H11Protocol.stream_send = _wrap_stream_send(  # type: ignore[method-assign]
            H11Protocol.stream_send)
