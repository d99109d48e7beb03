"""AWS's binary event-stream framing (``application/vnd.amazon.eventstream``), both ways.

One message is::

    total length (4, big-endian) | headers length (4) | prelude CRC32 (4)
    headers | payload | message CRC32 (4)

and a header is ``name length (1) | name | value type (1) | value``. The decoder is
incremental (bytes in, whole messages out, a message split across any reads) and
bounded: a message longer than :data:`MAX_MESSAGE_BYTES`, headers longer than
:data:`MAX_HEADERS_BYTES` or a CRC mismatch is a protocol error, never an unbounded
buffer. (The fake Bedrock server, ``triogate.testing.fakebedrock``, has its own encoder.)
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import attrs

from triogate.errors import ProviderProtocolError

#: Limits of one message (AWS's own: 16 MiB payloads, 128 KiB of headers).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024 + 128 * 1024 + 16
MAX_HEADERS_BYTES = 128 * 1024
_PRELUDE = struct.Struct(">III")
_MIN_MESSAGE = _PRELUDE.size + 4
# Header value types: fixed sizes, or None for a 2-byte length then the bytes.
_FIXED = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}


@attrs.frozen
class EventMessage:
    """One decoded message: its headers (string and bytes values decoded) and payload."""

    headers: dict[str, Any]
    payload: bytes


def _headers(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    at = 0
    while at < len(data):
        size = data[at]
        name = data[at + 1:at + 1 + size].decode("utf-8")
        at += 1 + size
        kind = data[at]
        at += 1
        if kind in (0, 1):
            out[name] = kind == 0
        elif kind in _FIXED:
            width = _FIXED[kind]
            raw = data[at:at + width]
            out[name] = raw if kind == 9 else int.from_bytes(raw, "big", signed=True)
            at += width
        elif kind in (6, 7):
            (length,) = struct.unpack_from(">H", data, at)
            raw = data[at + 2:at + 2 + length]
            out[name] = raw.decode("utf-8") if kind == 7 else raw
            at += 2 + length
        else:
            raise ProviderProtocolError(f"event-stream header of unknown type {kind}")
        if at > len(data):
            raise ProviderProtocolError("event-stream header runs past its section")
    return out


#: Distinct header sections remembered per stream (a stream repeats a handful).
_HEADER_CACHE = 32


class EventStreamDecoder:
    """Incremental decoder: ``feed`` bytes, get the messages they completed.

    A stream repeats the same few header sections (every text delta has the same three
    headers), so each distinct section is parsed once per stream and shared: callers
    must not change a message's ``headers``.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._parsed: dict[bytes, dict[str, Any]] = {}

    @property
    def pending(self) -> int:
        """Bytes held of a message not yet complete."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[EventMessage]:
        """Parse ``chunk``; return the messages it completed (often none, sometimes many).

        Raises:
            ProviderProtocolError: a bad length, a CRC mismatch, a malformed header.
        """
        self._buffer += chunk
        out: list[EventMessage] = []
        buffer = self._buffer
        start = 0
        while len(buffer) - start >= _PRELUDE.size:
            total, headers_length, prelude_crc = _PRELUDE.unpack_from(buffer, start)
            if zlib.crc32(buffer[start:start + 8]) != prelude_crc:
                raise ProviderProtocolError("event-stream prelude CRC mismatch")
            if not _MIN_MESSAGE + headers_length <= total <= MAX_MESSAGE_BYTES or (
                    headers_length > MAX_HEADERS_BYTES):
                raise ProviderProtocolError(f"event-stream message of bad size {total}")
            if len(buffer) - start < total:
                break
            end = start + total
            (message_crc,) = struct.unpack_from(">I", buffer, end - 4)
            if zlib.crc32(buffer[start:end - 4]) != message_crc:
                raise ProviderProtocolError("event-stream message CRC mismatch")
            head_end = start + _PRELUDE.size + headers_length
            raw = bytes(buffer[start + _PRELUDE.size:head_end])
            headers = self._parsed.get(raw)
            if headers is None:
                try:
                    headers = _headers(raw)
                except (IndexError, UnicodeDecodeError, struct.error) as exc:
                    raise ProviderProtocolError(
                        f"event-stream header is malformed: {exc}") from exc
                if len(self._parsed) < _HEADER_CACHE:
                    self._parsed[raw] = headers
            out.append(EventMessage(headers, bytes(buffer[head_end:end - 4])))
            start = end
        del buffer[:start]
        return out

    def close(self) -> None:
        """End of input. Raises ProviderProtocolError if a message was cut short."""
        if self._buffer:
            raise ProviderProtocolError(
                f"event stream ended inside a message ({len(self._buffer)} bytes)")
