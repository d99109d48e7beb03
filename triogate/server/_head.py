"""Bytes on the wire for a response: the status line and headers, chunk framing, ``date``.

A response head is built once per response, straight into bytes: no event objects, no
per-header validation calls. Header names and values come from the application, so the
head is refused if a value carries a line break (response splitting): counting ``\\r``
and ``\\n`` in the finished head costs two C scans instead of a check per header.
"""

from __future__ import annotations

import time
from http import HTTPStatus
from typing import TYPE_CHECKING
from wsgiref.handlers import format_date_time

if TYPE_CHECKING:
    from collections.abc import Sequence

#: ``HTTP/1.1 200 OK\r\n`` for every status :mod:`http` names; others get no phrase.
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("ascii"))
                 for s in HTTPStatus}

#: The last chunk of a chunked body (no trailers).
LAST_CHUNK = b"0\r\n\r\n"


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        if not 100 <= status <= 999:
            raise ValueError(f"invalid HTTP status {status!r}")
        line = b"HTTP/1.1 %d \r\n" % status
    return line


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (``data`` must not be empty)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def encode_head(status: int, lines: Sequence[bytes], extra: bytes) -> bytes:
    """The response head: status line, the application's header ``lines`` (each
    ``name: value\\r\\n``), then ``extra`` (the server's own, already framed), then the
    blank line.

    Raises:
        ValueError: a header name or value carries ``\\r`` or ``\\n``.
    """
    head = b"".join((status_line(status), *lines, extra, b"\r\n"))
    # Each line (status, header, the blank one) ends in one \r\n and has no other \r or
    # \n: any more of them is a line break inside a name or value.
    breaks = len(lines) + extra.count(b"\n") + 2
    if head.count(b"\n") != breaks or head.count(b"\r") != breaks:
        raise ValueError("a response header carries a line break")
    return head


class CachedDate:
    """The ``date`` header line, formatted at most once a second (its resolution)."""

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def __call__(self) -> bytes:
        """``date: <IMF-fixdate>\\r\\n`` for the current second."""
        now = int(time.time())
        if now != self._second:
            self._line = b"date: " + format_date_time(now).encode("ascii") + b"\r\n"
            self._second = now
        return self._line
