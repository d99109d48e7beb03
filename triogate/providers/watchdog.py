"""Read timeouts of upstream bodies: one watchdog per run, not a deadline scope per read.

A streamed body waits on its upstream once per chunk. Bounding each wait with its own
``trio.CancelScope(deadline=...)`` cost more than the chunk's own work (entering and
leaving a scope is dozens of Python calls in Trio, and registers a deadline each time),
and the timeout almost never fires. Here a body registers once (:meth:`Watchdog.watch`),
and each wait costs one clock read: the reader stamps :attr:`ReadWatch.waiting_since`
before it waits and clears it after. One task per trio run (:func:`watchdog`) keeps the
registered bodies in a heap by the earliest moment each could time out, and looks at a
body only then:

* the body is waiting, and has been for its whole timeout: it fires
  (:attr:`ReadWatch.fired`, then ``trio.lowlevel.notify_closing`` on the socket, which
  wakes the reader with ``ClosedResourceError``; the reader raises ``httpx.ReadTimeout``
  as the scope did, and the body's connection is closed, never reused);
* it is waiting, but began later: it is looked at again when that wait could expire;
* it is not waiting: again a whole timeout from now (the soonest a wait starting now
  could expire).

So a wait that lasts longer than the timeout fails at the same moment as with a deadline
scope per wait, and a busy stream costs the watchdog one heap step per timeout period
(the default stream timeout is minutes), not one per chunk.

The watchdog is a system task (``trio.lowlevel.spawn_system_task``), the one per-run
service trio offers for this: the transport has no nursery of its own (httpx and tests
build it outside any), and the watchdog's life is the run's. It never raises (a system
task's exception would crash the run); it only reads clocks and flags and calls
``notify_closing``.
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol, final

import trio

#: Pruning threshold: closed bodies' heap entries are dropped once they outnumber the
#: live ones by this many (a closed body otherwise stays in the heap until it is due,
#: up to its timeout: with minutes of timeout and thousands of short streams a second,
#: hundreds of thousands of entries).
_PRUNE_SLACK = 1024

_INF = math.inf


class Paced(Protocol):
    """What a run's stream pacer (``api/pacing.py``) tells the upstream reads."""

    #: Whether the streams wait a window between a client write and their next read.
    behind: bool


@final
class _Unpaced:
    """No pacer in this run: never behind."""

    behind = False


@final
class ReadWatch:
    """One body's read timeout, as the watchdog sees it.

    Attributes:
        fd: the socket the body reads (what firing wakes).
        timeout_s: how long one wait may last (seconds).
        waiting_since: trio time at which the current wait began; ``inf`` when not
            waiting. The reader sets and clears it around each wait.
        fired: set by the watchdog when a wait outlasted ``timeout_s`` (the reader then
            raises a timeout, not a connection error).
        closed: set by :meth:`Watchdog.unwatch`; the watchdog drops the body.
        dog: the run's watchdog (its :attr:`Watchdog.pacer`, read per read behind).
    """

    __slots__ = ("closed", "dog", "fd", "fired", "timeout_s", "waiting_since")

    def __init__(self, dog: Watchdog, fd: int, timeout_s: float) -> None:
        self.dog = dog
        self.fd = fd
        self.timeout_s = timeout_s
        self.waiting_since = _INF
        self.fired = False
        self.closed = False


@final
class Watchdog:
    """Times out the waits of every body registered with it (see the module)."""

    def __init__(self) -> None:
        # (due, sequence, watch): due is when the watch must be looked at next.
        self._heap: list[tuple[float, int, ReadWatch]] = []
        self._seq = 0
        self._live = 0
        self._stale = 0  # closed watches still in the heap
        self._sleep = trio.CancelScope()  # its deadline: the heap's first due
        #: The run's stream pacer (``http1.set_pacer``): while it holds the streams, a
        #: read behind takes no extra scheduler pass (an attribute, not a RunVar lookup
        #: per read: a RunVar's miss raises).
        self.pacer: Paced = _Unpaced()

    def watch(self, fd: int, timeout_s: float) -> ReadWatch:
        """Register a body reading ``fd`` whose waits may last ``timeout_s`` each."""
        watch = ReadWatch(self, fd, timeout_s)
        self._push(trio.current_time() + timeout_s, watch)
        self._live += 1
        return watch

    def rearm(self, watch: ReadWatch) -> None:
        """Undo a firing that came too late: the wait had already been given its bytes
        (they arrived in the same scheduler pass, and data wins, as over a cancelled
        deadline scope), so the body goes on, watched again."""
        watch.fired = watch.closed = False
        self._live += 1
        self._push(trio.current_time() + watch.timeout_s, watch)

    def unwatch(self, watch: ReadWatch) -> None:
        """The body is done: forget it (its heap entry goes when due, or in a prune)."""
        if watch.closed:
            return
        watch.closed = True
        self._live -= 1
        self._stale += 1
        if self._stale > self._live + _PRUNE_SLACK:
            self._heap = [entry for entry in self._heap if not entry[2].closed]
            heapq.heapify(self._heap)
            self._stale = 0

    def _push(self, due: float, watch: ReadWatch) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, watch))
        if due < self._sleep.deadline:
            self._sleep.deadline = due

    async def run(self) -> None:
        """Sleep until the first due watch, look at the due ones; for ever."""
        while True:
            self._sleep = trio.CancelScope(deadline=self._heap[0][0] if self._heap else _INF)
            with self._sleep:
                await trio.sleep_forever()
            self._expire(trio.current_time())

    def _expire(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, watch = heapq.heappop(heap)
            if watch.closed:
                self._stale -= 1
                continue
            since = watch.waiting_since
            if since == _INF:
                self._push(now + watch.timeout_s, watch)
            elif since + watch.timeout_s > now:
                self._push(since + watch.timeout_s, watch)
            else:
                watch.fired = True
                self._live -= 1
                watch.closed = True  # the body closes its connection after the timeout
                trio.lowlevel.notify_closing(watch.fd)


_WATCHDOG: trio.lowlevel.RunVar[Watchdog] = trio.lowlevel.RunVar("triogate_read_watchdog")


def watchdog() -> Watchdog:
    """This run's watchdog, started on first use (not a checkpoint)."""
    try:
        return _WATCHDOG.get()
    except LookupError:
        dog = Watchdog()
        _WATCHDOG.set(dog)
        trio.lowlevel.spawn_system_task(dog.run, name="triogate upstream read watchdog")
        return dog
