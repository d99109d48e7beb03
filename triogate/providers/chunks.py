"""Chunked transfer coding: the chunk-size line, and whole chunks taken off a read's
bytes or a connection's buffer (the stream hot path of :mod:`.http1`).

A chunk size is read as h11 (httpcore's parser) reads it: hex digits, then optionally
``;`` and an extension. Python's ``int(..., 16)`` would also take ``0x5``, ``1_0``,
``+5``, ``-1`` or `` 5``; those are refused (the body's reader raises).
"""

from __future__ import annotations

#: What a chunk size may hold; ``line.translate(None, _HEX_DIGITS)`` leaves what else it
#: holds (a regex match cost twice as much, on the path of every stream chunk).
_HEX_DIGITS = b"0123456789abcdefABCDEF"
#: Hex digits of a chunk size at most (h11 reads 20; 16 is an exabyte).
_MAX_DIGITS = 16


def chunk_size(buf: bytearray, end: int) -> int | None:
    """The size on the chunk-size line ``buf[:end]``, or None if it is not one."""
    return chunk_size_of(bytes(buf[:end]))


def chunk_size_of(line: bytes) -> int | None:
    """A chunk-size line's size (hex digits, then optionally ``;`` and an extension, as
    h11 reads it), or None."""
    if not _hex(line):
        line = line.split(b";", 1)[0].rstrip(b" \t")
        if not _hex(line):
            return None
    return int(line, 16)


def _hex(line: bytes) -> bool:
    """Whether ``line`` is a chunk size: 1 to 16 hex digits, nothing else."""
    return 0 < len(line) <= _MAX_DIGITS and not line.translate(None, _HEX_DIGITS)


def whole_chunks(data: bytes) -> tuple[bytes, int]:
    """The data of the whole data chunks ``data`` starts with, joined, and where the rest
    starts (0: none; the rest begins at a partial, last or malformed chunk, or a size line
    with an extension, left for the buffered path as :func:`buffered_chunk` leaves it).

    One pass over the read's bytes, no buffer round trip. A read of exactly one chunk (a
    worker that keeps up) costs what the single-chunk check it replaces did; one of
    several (a worker that is behind) 0.75 µs per chunk against 1.1 for the bytearray and
    :func:`buffered_chunk` per chunk (timeit)."""
    end = data.find(b"\r\n")
    line = data[:end]
    if end <= 0 or end > _MAX_DIGITS or line.translate(None, _HEX_DIGITS):
        return b"", 0
    size = int(line, 16)
    start = end + 2
    stop = start + size
    total = len(data)
    if size <= 0 or stop + 2 > total or not data.startswith(b"\r\n", stop):
        return b"", 0
    if stop + 2 == total:
        return data[start:stop], total  # the usual read: exactly one chunk
    pieces = [data[start:stop]]
    pos = stop + 2
    find = data.find
    while pos < total:
        end = find(b"\r\n", pos)
        line = data[pos:end]
        if end <= pos or end - pos > _MAX_DIGITS or line.translate(None, _HEX_DIGITS):
            break
        size = int(line, 16)
        start = end + 2
        stop = start + size
        if size <= 0 or stop + 2 > total or not data.startswith(b"\r\n", stop):
            break
        pieces.append(data[start:stop])
        pos = stop + 2
    return b"".join(pieces), pos


def buffered_chunk(buf: bytearray) -> bytes | None:
    """Take the next data chunk if it is whole in ``buf``; else None and ``buf`` as it
    was (an incomplete, last or malformed chunk is left for ``UpstreamBody._chunks``)."""
    end = buf.find(b"\r\n")
    if end < 0:
        return None
    size = chunk_size(buf, end)
    if size is None:
        return None
    start = end + 2
    if size == 0 or len(buf) < start + size + 2 or buf[start + size : start + size + 2] != b"\r\n":
        return None
    piece = bytes(buf[start : start + size])
    del buf[: start + size + 2]
    return piece
