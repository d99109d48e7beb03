"""The read loop of a streaming response decoded into events, chunk by chunk.

Gemini's ``data:`` lines (:mod:`triogate.providers.sse_data`) and Bedrock's binary event
stream (:mod:`triogate.providers.bedrock`) decode differently but pull their bytes the
same way: read a chunk when nothing decoded is waiting, map transport errors, and mark
the end once the response has no more.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Generic, TypeVar

import trio

from triogate.providers.http import map_exceptions

if TYPE_CHECKING:
    import httpx

T = TypeVar("T")


class ChunkSource(Generic[T]):
    """Items decoded from a response's chunks; subclasses decode in ``_feed``."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_bytes()
        self._pending: collections.deque[T] = collections.deque()
        self._ended = False

    def _feed(self, chunk: bytes) -> None:
        """Decode ``chunk``, appending every whole item to ``_pending``."""
        raise NotImplementedError

    def _close(self) -> None:
        """The response has ended: decode what is held, if anything."""
        self._ended = True

    async def _next_item(self) -> T | None:
        """The next decoded item, reading as needed; None at the end (a checkpoint).
        Raises ProviderError subclasses."""
        if self._pending:
            await trio.lowlevel.checkpoint()
        while not self._pending:
            if self._ended:
                await trio.lowlevel.checkpoint()
                return None
            with map_exceptions():
                try:
                    chunk = await self._chunks.__anext__()
                except StopAsyncIteration:
                    self._close()
                    continue
            self._feed(chunk)
        return self._pending.popleft()
