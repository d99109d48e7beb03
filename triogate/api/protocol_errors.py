"""Errors of the HTTP layer itself (a malformed request, a head too large, a request that
stopped arriving), in OpenAI's error shape with an ``x-request-id``.

The server (:mod:`triogate.server`) answers these before any route sees the request; it
takes :func:`error_body` as its ``error_body`` and adds ``content-length``, ``date`` and
``connection: close`` itself. No stack trace ever reaches the client.
"""

from __future__ import annotations

import uuid

from triogate.api.errors import ApiError, render

_MESSAGES = {
    400: "malformed HTTP request",
    408: "request timed out: the client stopped sending it",
    413: "request too large",
    431: "request header fields too large",
    500: "internal error",
    501: "transfer coding not implemented (only chunked is)",
    505: "HTTP version not supported (HTTP/1.1 only)",
}


def body_for(status: int, reason: str | None = None) -> bytes:
    """The OpenAI-shaped error body for a protocol-level ``status`` (``reason``: what
    the server found wrong, when it says)."""
    kind = "api_error" if status >= 500 else "invalid_request_error"
    message = reason or _MESSAGES.get(status, "the HTTP request was refused")
    return render(ApiError(status, message, kind), "openai")


def error_body(status: int, reason: str | None = None
               ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """Body and headers of the server's own answer to a protocol error (``status``)."""
    return body_for(status, reason), [(b"content-type", b"application/json"),
                                      (b"x-request-id", uuid.uuid4().hex.encode())]
