"""A stream whose client speaks the upstream's API: the upstream's own event bytes go on.

When client and upstream both speak OpenAI chat completions, or both Anthropic messages,
the general path
(:class:`~triogate.providers.sse.SSESource` -> :class:`~triogate.providers.streaming.
TranslatedStream` -> ``api/sse.encode``) turns every event into a ``ServerSentEvent``,
then a dict, copies the dict (the passthrough translator) and encodes it again, one event
per step through httpx's body iterators. :class:`RawStream` does the same job with the
bytes one upstream read brought:

* the body is read with ``UpstreamBody.read_some`` (:mod:`.http1`): all the whole chunks a
  read brought at once, no generator layers;
* an event written the usual way for its API (its :class:`Framing`: chat's ``data: <json>``
  and a blank line, messages' ``event: <type>``, ``data: <json>`` and a blank line; LF
  only) is cut out of the bytes as it is; its JSON is parsed once (usage tracking, the
  ``include_usage`` filter and the response cache need the dict) and its bytes are handed
  on as :attr:`RawStream.wire`, so the client gets what the upstream sent;
* anything else (a comment, other fields such as ``id:``, several ``data:`` lines, CR
  line ends, an ``event:`` name that is not the JSON's ``type``) goes through
  :class:`~triogate.providers.sse.SSEDecoder` or ``api/sse.encode`` as before and has no
  wire bytes: the caller encodes it, as it does the usage chunk
  :class:`~triogate.providers.translate.ChatPassthrough` adds at the end.

Events, usage, errors and their order are those of the general path.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import trio

from triogate.errors import ProviderError, ProviderProtocolError
from triogate.providers.http import SHAPE_ERRORS, map_exceptions
from triogate.providers.http1 import DEFAULT_MAX_EVENT_BYTES
from triogate.providers.sse import SSEDecoder

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from triogate.providers.records import Usage
    from triogate.providers.usage import UsageTracker

_DATA = b"data: "
_EVENT = b"event: "
_DATA_AT = len(_DATA)
_DONE = b"[DONE]"
_OBJECT_START = (b"{", "{")

# One entry of the queue: an event and its wire bytes (None: encode it), or the error
# that ends the stream at that point.
_Item = tuple[dict[str, Any], bytes | None] | ProviderError


class Framing(Protocol):
    """How one API's stream writes an event in the usual form (what ``api/sse.encode``
    writes for it, given compact JSON)."""

    def data_at(self, buf: bytes, start: int, end: int) -> int:
        """Where the JSON starts, counted from ``start``, in the event from ``start`` to
        its blank line at ``end`` (``buf[end:end + 2] == b"\\n\\n"``) if it has the usual
        form; else -1."""
        ...

    def encodes_as(self, wire: bytes, data_at: int, event: Mapping[str, Any]) -> bool:
        """Whether ``api/sse.encode`` writes ``event`` with ``wire``'s framing."""
        ...


class ChatFraming:
    """OpenAI chat completions: ``data: <json>`` and a blank line."""

    def data_at(self, buf: bytes, start: int, end: int) -> int:
        if buf.startswith(_DATA, start) and buf.find(b"\n", start, end) < 0:
            return len(_DATA)
        return -1

    def encodes_as(self, wire: bytes, data_at: int, event: Mapping[str, Any]) -> bool:
        return True


class MessagesFraming:
    """Anthropic messages: ``event: <type>``, ``data: <json>`` and a blank line, the
    name being the JSON's ``type`` (``api/sse.encode`` names an event by it)."""

    def data_at(self, buf: bytes, start: int, end: int) -> int:
        if not buf.startswith(_EVENT, start):
            return -1
        line = buf.find(b"\n", start, end)
        if line < 0 or not buf.startswith(_DATA, line + 1) or buf.find(b"\n", line + 1, end) >= 0:
            return -1
        return line + 1 + len(_DATA) - start

    def encodes_as(self, wire: bytes, data_at: int, event: Mapping[str, Any]) -> bool:
        kind = event.get("type")
        return isinstance(kind, str) and wire[len(_EVENT) : data_at - len(_DATA) - 1] == (
            kind.encode())


CHAT = ChatFraming()
MESSAGES = MessagesFraming()


class RawTranslator(Protocol):
    """The translator of a stream whose events go on as they are: it watches them (what
    ``finish`` needs) and may add closing events."""

    def observe(self, event: Mapping[str, Any]) -> None: ...

    def finish(self, usage: Usage) -> list[dict[str, Any]]: ...


class RawStream:
    """The ProviderStream of an upstream whose client speaks its API (see the module).

    Each event handed out (by ``__anext__`` or ``next_nowait``) sets :attr:`wire`: its
    bytes as the upstream sent them, the blank line included, or None when the caller
    must encode it. Each step is a checkpoint: the read, or a yield for an event already
    read.
    """

    def __init__(self, read: Callable[[], Awaitable[bytes]], tracker: UsageTracker,
                 translator: RawTranslator, framing: Framing,
                 max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._read = read
        self._tracker = tracker
        self._translator = translator
        self._framing = framing
        # Bound once: looked up per event otherwise.
        self._observe_usage = tracker.observe
        self._observe = translator.observe
        self._data_at = framing.data_at
        self._encodes_as = None if isinstance(framing, ChatFraming) else framing.encodes_as
        self._max = max_event_bytes
        # The bytes after the last whole event, in the pieces they came in (joined once
        # a read may end the event: a long event costs one pass, not one per read).
        self._parts: list[bytes] = []
        self._held = 0  # their length
        self._decoder: SSEDecoder | None = None  # once a CR showed up: for the rest
        self._general = SSEDecoder(max_event_bytes)  # for events of another form
        self._pending: collections.deque[_Item] = collections.deque()
        self._ended = False  # [DONE], the body's end, or an error queued
        self._finished = False  # the translator's finish events queued (or an error)
        #: The wire bytes of the event handed out last; None: encode it.
        self.wire: bytes | None = None

    @property
    def usage(self) -> Usage:
        """Reported usage once the upstream sent it; else counted so far."""
        return self._tracker.usage

    def __aiter__(self) -> RawStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._pending:
            await trio.lowlevel.checkpoint()
        while not self._pending:
            if self._finished:
                raise StopAsyncIteration
            if self._ended:
                self._finish()
                continue
            try:
                data = await self._read()
            except Exception:
                with map_exceptions():
                    raise
            try:
                if data:
                    self._take(data)
                else:
                    self._end()
            except ProviderError as exc:  # an event past the bound (the SSE decoder's)
                exc.__traceback__ = None  # its frames hold the bytes: let them go now
                self._fail(exc)
        return self._next()

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if no read is needed for it (a burst the last read brought,
        or the finish events after [DONE]); else None. Not a checkpoint; never raises
        (an error waits for ``__anext__``)."""
        if not self._pending:
            if not self._ended or self._finished:
                return None
            self._finish()
        if not self._pending or isinstance(self._pending[0], ProviderError):
            return None
        return self._next()

    def _next(self) -> dict[str, Any]:
        item = self._pending.popleft()
        if isinstance(item, ProviderError):
            self._pending.clear()
            self._ended = self._finished = True
            raise item
        event, self.wire = item
        return event

    # ------------------------------------------------------------------ parsing

    def _take(self, data: bytes) -> None:
        """Queue the events ``data`` completes."""
        if self._ended:
            return
        if self._decoder is not None:
            self._decoded(self._decoder.feed(data))
            return
        if self._held:
            if (b"\r" not in data and b"\n\n" not in data
                    and not (data[:1] == b"\n" and self._parts[-1].endswith(b"\n"))):
                # No event can end in these bytes (every one ends at a blank line): kept
                # as they are, not joined and scanned again.
                self._hold(data)
                return
            buf = b"".join((*self._parts, data))
            self._parts.clear()
            self._held = 0
        else:
            buf = data
        if b"\r" in data:  # CR line ends: the general parser from here on
            self._decoder = SSEDecoder(self._max)
            self._decoded(self._decoder.feed(buf))
            return
        start = 0
        size = len(buf)
        if self._encodes_as is None:  # chat: one scan per event (see _take_chat)
            start = self._take_chat(buf, size)
            if start < size:
                self._hold(buf[start:])
            return
        data_at = self._data_at
        while not self._ended:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            if (at := data_at(buf, start, end)) >= 0:
                # One event per read is the usual case: its bytes are the read's, uncut.
                wire = buf if start == 0 and end + 2 == size else buf[start : end + 2]
                self._event(wire[at:-2], wire, at)
            elif end > start:
                self._decoded(self._general.feed(buf[start : end + 2]))
            start = end + 2
        if start < size:
            self._hold(buf[start:])

    def _hold(self, data: bytes) -> None:
        """Keep ``data`` for the event it begins or continues; past the bound, the stream
        fails (queued, not raised: no traceback keeps the bytes alive)."""
        self._parts.append(data)
        self._held += len(data)
        if self._held > self._max:
            self._fail(ProviderProtocolError(
                f"upstream stream event larger than {self._max} bytes"))

    def _take_chat(self, buf: bytes, size: int) -> int:
        """``_take``'s loop for chat's framing; where the unread bytes start.

        The usual event is one line, ``data: <json>``, and a blank line: the first LF
        after its start is followed by another. One ``find`` answers both where the event
        ends and whether it has the usual form (``ChatFraming.data_at`` and the search
        for the blank line scanned it twice)."""
        start = 0
        while not self._ended:
            line = buf.find(b"\n", start)
            if line < 0:
                break
            if line + 1 < size and buf[line + 1] == 10 and buf.startswith(_DATA, start):
                # One event per read is the usual case: its bytes are the read's, uncut.
                wire = buf if start == 0 and line + 2 == size else buf[start : line + 2]
                self._event(wire[_DATA_AT:-2], wire, _DATA_AT)
                start = line + 2
                continue
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            if end > start:
                self._decoded(self._general.feed(buf[start : end + 2]))
            start = end + 2
        return start

    def _end(self) -> None:
        """The body ended: what is left is dispatched (an unterminated last event)."""
        if not self._ended:
            decoder = self._decoder or SSEDecoder(self._max)
            self._decoded(decoder.feed(b"".join(self._parts)) + decoder.close())
        self._parts.clear()
        self._held = 0
        self._ended = True

    def _decoded(self, events: list[Any]) -> None:
        for sse in events:
            if self._ended:
                return
            self._event(sse.data, None, 0)

    def _event(self, data: bytes | str, wire: bytes | None, data_at: int) -> None:
        """One event's data: [DONE] ends the stream; else a JSON object, observed."""
        # A JSON object starts with "{": only anything else can be [DONE] (no strip copy).
        if data[:1] not in _OBJECT_START and data.strip() == (
                _DONE if isinstance(data, bytes) else "[DONE]"):
            self._ended = True
            return
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            error = ProviderProtocolError(
                f"upstream stream event is not JSON: {_text(data)[:200]!r}")
            error.__cause__ = exc
            self._fail(error)
            return
        if not isinstance(value, dict):
            self._fail(ProviderProtocolError(
                f"upstream stream event is not an object: {_text(data)[:200]!r}"))
            return
        try:
            self._observe_usage(value)
            self._observe(value)
        except ProviderError as exc:  # an in-stream error object
            self._fail(exc)
            return
        except SHAPE_ERRORS as exc:
            error = ProviderProtocolError(
                f"upstream stream event has an unexpected shape: {exc!r}")
            error.__cause__ = exc
            self._fail(error)
            return
        encodes_as = self._encodes_as  # None: every event is written as it came (chat)
        if wire is not None and encodes_as is not None and not encodes_as(wire, data_at, value):
            wire = None
        self._pending.append((value, wire))

    def _finish(self) -> None:
        """After the last event: the stream must be complete; the closing events."""
        self._finished = True
        try:
            self._tracker.check_complete()
            events = self._translator.finish(self._tracker.usage)
        except ProviderError as exc:
            self._pending.append(exc)
            return
        except SHAPE_ERRORS as exc:
            error = ProviderProtocolError(
                f"upstream stream event has an unexpected shape: {exc!r}")
            error.__cause__ = exc
            self._pending.append(error)
            return
        self._pending.extend((event, None) for event in events)

    def _fail(self, error: ProviderError) -> None:
        self._pending.append(error)
        self._ended = self._finished = True
        # Nothing more is parsed: the bytes held go now, not when the last reference to
        # the stream does (an error's traceback can keep it in a cycle until a full
        # garbage collection).
        self._parts.clear()
        self._held = 0
        self._decoder = None
        self._general = SSEDecoder(self._max)


def _text(data: bytes | str) -> str:
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
