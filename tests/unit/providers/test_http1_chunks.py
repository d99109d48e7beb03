"""Chunk framing of ``providers/http1.py``: ``whole_chunk`` (a read that brought exactly one
data chunk, taken without the buffer) agrees with the buffered parse on every input."""

from __future__ import annotations

import pytest

from triogate.providers.http1 import buffered_chunk, whole_chunk

CASES = [
    b"5\r\nhello\r\n",               # the usual read: one chunk
    b"1a\r\n" + b"x" * 26 + b"\r\n",  # hex size
    b"5\r\nhello\r\n3\r\none\r\n",    # two chunks: buffered
    b"5\r\nhel",                      # a partial chunk: buffered
    b"5\r\nhelloXY",                  # no CRLF after the data: the buffered path refuses it
    b"5;ext=1\r\nhello\r\n",          # an extension: the buffered path reads it
    b"0\r\n\r\n",                     # the last chunk: the buffered path ends the body
    b"zz\r\nhello\r\n",               # a bad size: the buffered path refuses it
    b"\r\nhello\r\n",                 # no size at all
    b"",
]


@pytest.mark.parametrize("data", CASES)
def test_whole_chunk_takes_exactly_one_whole_chunk(data: bytes) -> None:
    piece = whole_chunk(data)
    buf = bytearray(data)
    buffered = buffered_chunk(buf)
    if piece is None:  # left to the buffered path, whatever it makes of it
        return
    assert piece == buffered
    assert not buf  # the chunk was all of it
