"""Errors of the HTTP layer itself (a malformed request line, headers too large), in
OpenAI's error shape with an ``x-request-id``.

hypercorn answers these before any ASGI application sees the request, with an empty
body (``content-length: 0``). It has no hook for them, so :func:`install` gives its HTTP/1
protocol class an error response of the gateway's shape. The swap is idempotent and only
changes what those error responses carry (status, closing the connection and hypercorn's
own headers stay as they were).
"""

from __future__ import annotations

import uuid
from itertools import chain
from typing import Any

import h11
from hypercorn.protocol.h11 import H11Protocol

from triogate.api.errors import ApiError, render

_MESSAGES = {
    400: "malformed HTTP request",
    408: "request timed out: the client stopped sending it",
    413: "request too large",
    431: "request header fields too large",
}


def body_for(status: int) -> bytes:
    """The OpenAI-shaped error body for a protocol-level ``status``."""
    return render(ApiError(status, _MESSAGES.get(status, "the HTTP request was refused"),
                           "invalid_request_error"), "openai")


async def _send_error_response(self: Any, status_code: int) -> None:
    body = body_for(status_code)
    await self._send_h11_event(
        h11.Response(
            status_code=status_code,
            headers=list(chain(
                [(b"content-type", b"application/json"),
                 (b"content-length", str(len(body)).encode()),
                 (b"x-request-id", uuid.uuid4().hex.encode()),
                 (b"connection", b"close")],
                self.config.response_headers("h11"),
            )),
        )
    )
    await self._send_h11_event(h11.Data(data=body))
    await self._send_h11_event(h11.EndOfMessage())


def install() -> None:
    """Make hypercorn's HTTP/1 protocol errors carry a JSON body and a request id."""
    H11Protocol._send_error_response = _send_error_response  # type: ignore[method-assign]
