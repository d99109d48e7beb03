"""The ProviderStream every provider returns: source -> tracker -> translator.

A provider stream is three small parts in a row::

    source (upstream events, as dicts)  ->  tracker (usage)  ->  translator (client shape)

The *source* is an SSE body (:class:`~triogate.providers.sse.SSESource`) or the mock's
timed chunks. The *tracker* (:mod:`.usage`) knows the usage so far. The *translator*
(:mod:`.translate`) turns each upstream event into zero or more events of the client's API.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Protocol

import trio

from triogate.errors import ProviderProtocolError
from triogate.providers.http import SHAPE_ERRORS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.providers.records import Api, Usage
    from triogate.providers.usage import UsageTracker


class EventSource(Protocol):
    """Upstream events as dicts; None once the upstream said it is done."""

    async def next_event(self) -> dict[str, Any] | None:
        """The next event (a checkpoint: it waits for the upstream, or yields)."""
        ...

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if it is already read and decodes cleanly; else None (then
        ``next_event`` reads, ends the stream or raises). Never blocks, never raises."""
        ...


class StreamTranslator(Protocol):
    """Turns upstream events into client events; ``finish`` closes the client's stream."""

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]: ...

    def finish(self, usage: Usage) -> list[dict[str, Any]]: ...


class Passthrough:
    """The client speaks the upstream's API: events go through untouched."""

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [dict(event)]

    def observe(self, event: Mapping[str, Any]) -> None:
        """An event that goes on as it is (``rawsse.py``): ``finish`` needs nothing of it."""

    def finish(self, usage: Usage) -> list[dict[str, Any]]:
        return []


class Chain:
    """Two translators in a row (e.g. Anthropic events -> chat chunks -> Responses events)."""

    def __init__(self, first: StreamTranslator, second: StreamTranslator) -> None:
        self._first, self._second = first, second

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [out for mid in self._first.feed(event) for out in self._second.feed(mid)]

    def finish(self, usage: Usage) -> list[dict[str, Any]]:
        out = [x for mid in self._first.finish(usage) for x in self._second.feed(mid)]
        return out + self._second.finish(usage)


class TranslatedStream:
    """The ProviderStream of every provider: source -> tracker -> translator.

    Each step of the iteration is a checkpoint: the source's read, or a yield here for an
    event already translated. The stream does not own the upstream response; the
    provider's context manager does.
    """

    def __init__(
        self, source: EventSource, tracker: UsageTracker, translator: StreamTranslator
    ) -> None:
        self._source = source
        self._tracker = tracker
        self._translator = translator
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._done = False
        self._error: ProviderProtocolError | None = None  # found by next_nowait

    @property
    def usage(self) -> Usage:
        """Reported usage once the upstream sent it; else counted so far."""
        return self._tracker.usage

    @property
    def wire(self) -> bytes | None:
        """Always None: translated events are encoded by the caller."""
        return None

    def __aiter__(self) -> TranslatedStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        # Always a checkpoint, even when the next event is already buffered: a consumer
        # looping over a burst of events stays cancellable and lets other tasks run. A
        # read from the source is one already (EventSource.next_event), so an event that
        # needs one does not pay for a second pass through trio's run loop.
        if self._pending:
            await trio.lowlevel.checkpoint()
        while not self._pending:
            if self._error is not None:
                raise self._error
            if self._done:
                raise StopAsyncIteration
            event = await self._source.next_event()
            try:
                if event is None:
                    self._done = True
                    self._tracker.check_complete()
                    self._pending.extend(self._translator.finish(self._tracker.usage))
                else:
                    self._tracker.observe(event)
                    self._pending.extend(self._translator.feed(event))
            except SHAPE_ERRORS as exc:
                self._done = True
                raise ProviderProtocolError(
                    f"upstream stream event has an unexpected shape: {exc!r}"
                ) from exc
        return self._pending.popleft()

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if it needs no read (a burst the upstream's last read brought),
        so that the caller can forward a burst in one write; None otherwise, and then
        ``__anext__`` reads, finishes or raises (a shape error found here included). Not
        a checkpoint; never raises."""
        while not self._pending:
            if self._done or self._error is not None:
                return None
            event = self._source.next_nowait()
            if event is None:
                return None
            try:
                self._tracker.observe(event)
                self._pending.extend(self._translator.feed(event))
            except SHAPE_ERRORS as exc:
                self._done = True
                self._error = ProviderProtocolError(
                    f"upstream stream event has an unexpected shape: {exc!r}"
                )
                self._error.__cause__ = exc
                return None
        return self._pending.popleft()


def check_streamable(api: Api) -> None:
    """Raise ValueError for an API that has no streamed form (embeddings, moderations)."""
    if api in ("embeddings", "moderations"):
        raise ValueError(f"{api} cannot be streamed")
