"""Chunk framing of ``providers/http1.py``: ``whole_chunks`` (the whole data chunks a read
brought, taken off its bytes without the buffer) agrees with the buffered parse
(``buffered_chunk`` chunk by chunk) on every input, and leaves it the same rest."""

from __future__ import annotations

import itertools

import pytest

from triogate.providers.chunks import buffered_chunk, whole_chunks

CASES = [
    b"5\r\nhello\r\n",               # the usual read: one chunk
    b"1a\r\n" + b"x" * 26 + b"\r\n",  # hex size
    b"5\r\nhello\r\n3\r\none\r\n",    # two chunks
    b"5\r\nhel",                      # a partial chunk: buffered
    b"5\r\nhelloXY",                  # no CRLF after the data: the buffered path refuses it
    b"5;ext=1\r\nhello\r\n",          # an extension: the buffered path reads it
    b"0\r\n\r\n",                     # the last chunk: the buffered path ends the body
    b"zz\r\nhello\r\n",               # a bad size: the buffered path refuses it
    b"\r\nhello\r\n",                 # no size at all
    b"-1\r\nhello\r\n",               # a negative size
    b"",
]
# Reads of several chunks, whole ones before a partial, last or malformed one.
READS = CASES + [a + b for a, b in itertools.product(CASES[:3], CASES)]


def _buffered(data: bytes) -> tuple[list[bytes], bytes]:
    buf = bytearray(data)
    pieces = []
    while (piece := buffered_chunk(buf)) is not None:
        pieces.append(piece)
    return pieces, bytes(buf)


@pytest.mark.parametrize("data", READS)
def test_whole_chunks_takes_what_the_buffered_parse_takes(data: bytes) -> None:
    joined, taken = whole_chunks(data)
    buffered, rest = _buffered(data)
    if not taken:  # left to the buffered path, whatever it makes of it
        assert joined == b""
        return
    # The same chunks, up to where whole_chunks stops (an extension stops it early: the
    # buffered path then reads on from the same rest).
    count = next(n for n in range(len(buffered) + 1) if b"".join(buffered[:n]) == joined)
    assert count > 0
    assert _buffered(data[taken:]) == (buffered[count:], rest)
