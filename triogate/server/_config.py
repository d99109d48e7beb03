"""The server's settings (units in the names) and its default protocol-error body."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

    #: ``status -> (body, headers)``: what a protocol error (400, 408, 431, 500, 501) carries.
    ErrorBody = Callable[[int, str | None], tuple[bytes, list[tuple[bytes, bytes]]]]


def plain_error(status: int, reason: str | None = None
                ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A protocol error as one line of text, with what it was when the server knows
    (applications pass their own shape)."""
    line = b"%d %b\n" % (status, reason.encode()) if reason else b"%d\n" % status
    return line, [(b"content-type", b"text/plain; charset=utf-8")]


@attrs.frozen(kw_only=True)
class ServerConfig:
    """How :func:`triogate.server.serve` treats its connections.

    ``keep_alive_s``: an idle connection (no request, none partly received) is closed
    after this long. ``body_read_timeout_s``: the longest a request's head may take from
    its first byte, and a body may go without a byte; then it is answered 408 and closed
    (``None``: no bound). ``body_total_timeout_s``: the longest a whole body may take
    from the end of its head, however steadily its bytes come (408; ``None``: no bound).
    ``shutdown_grace_s``: how long requests in flight may take to finish once shutdown
    starts. ``max_head_bytes``: a longer request head is answered 431 (16 KiB,
    h11's and hypercorn's default). ``write_timeout_s``: a write that cannot make
    progress this long means the client stopped reading; it is treated as gone.
    ``max_pipelined_bytes``: while a response is in flight, how much of the client's next
    requests is read ahead (beyond it, reading pauses until the response is done).
    ``backlog``: the kernel's listen queue. ``max_connections``: the most client
    connections open at once (``None``: no bound); at the bound an idle kept-alive
    connection is closed to make room, and with none idle new clients wait in the listen
    queue until one closes. ``error_body``: the body and headers of the server's own
    error answers, given the status and what the error was (None: the status's own
    message).
    """

    keep_alive_s: float = 75.0
    body_read_timeout_s: float | None = 30.0
    body_total_timeout_s: float | None = 60.0
    shutdown_grace_s: float = 10.0
    max_head_bytes: int = 16 * 1024
    write_timeout_s: float = 75.0
    max_pipelined_bytes: int = 64 * 1024
    backlog: int = 4096
    max_connections: int | None = None
    error_body: ErrorBody = plain_error
