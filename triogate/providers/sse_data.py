"""Server-sent events whose events are JSON ``data`` lines, read fast (Gemini's streams).

Google's ``alt=sse`` streams send each answer as one ``data: {json}`` line and a blank
line. This source splits lines with bytes methods (CR, LF and CRLF endings, also split
across reads), joins an event's ``data`` lines, skips comments and every other field
(``event``, ``id``, ``retry``: nothing here reads them), and hands out each event's JSON
object: the :class:`~triogate.providers.sse.SSESource` contract for streams that need no
event names, without a Python-level pass over every byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from triogate.errors import ProviderProtocolError
from triogate.providers.chunk_source import ChunkSource

if TYPE_CHECKING:
    import httpx

#: The longest line held while waiting for its end (a bound on one event's size).
MAX_LINE_BYTES = 16 * 1024 * 1024


class DataLineSource(ChunkSource[bytes]):
    """JSON objects from the ``data`` of each SSE event of a streaming response."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response)
        self._rest = b""  # an unfinished line (and a CR that may pair with the next LF)
        self._data: list[bytes] = []

    def _feed(self, chunk: bytes) -> None:
        data = self._rest + chunk
        held = b""
        if data.endswith(b"\r"):  # its LF may be the next read's first byte
            data, held = data[:-1], b"\r"
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        self._rest = lines.pop() + held
        if len(self._rest) > MAX_LINE_BYTES:
            raise ProviderProtocolError("upstream stream line exceeds the size bound")
        for line in lines:
            if not line:
                if self._data:
                    self._pending.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)

    def _close(self) -> None:
        self._ended = True
        self._feed(b"\n\n")  # an unterminated last event still counts (as SSEDecoder)

    @staticmethod
    def _decode(raw: bytes) -> dict[str, Any] | None:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None

    async def next_event(self) -> dict[str, Any] | None:
        """The next event's JSON (a checkpoint). Raises ProviderError subclasses."""
        raw = await self._next_item()
        if raw is None:
            return None
        value = self._decode(raw)
        if value is None:
            raise ProviderProtocolError(f"upstream stream event is not a JSON object: "
                                        f"{raw[:200]!r}")
        return value

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if already read and a JSON object; else None (never raises)."""
        if not self._pending:
            return None
        value = self._decode(self._pending[0])
        if value is not None:
            self._pending.popleft()
        return value
