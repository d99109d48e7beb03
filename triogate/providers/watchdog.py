"""Read timeouts of upstream bodies: one watchdog per run, not a deadline scope per read.

A streamed body waits on its upstream once per chunk. Bounding each wait with its own
``trio.CancelScope(deadline=...)`` cost more than the chunk's own work (entering and
leaving a scope is dozens of Python calls in Trio, and registers a deadline each time),
and the timeout almost never fires. Here a body registers once (:meth:`Watchdog.watch`),
and each wait costs one clock read: the reader stamps :attr:`ReadWatch.since`
before it waits and clears it after. One task per trio run (:func:`watchdog`) keeps the
registered bodies in a heap by the earliest moment each could time out, and looks at a
body only then (``triogate/_watch.py``, the mechanism the three watchdogs share):

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
from typing import Protocol, final

import trio

from triogate import _watch

#: Pruning threshold: closed bodies' heap entries are dropped once they outnumber the
#: live ones by this many (a closed body otherwise stays in the heap until it is due,
#: up to its timeout: with minutes of timeout and thousands of short streams a second,
#: hundreds of thousands of entries).
_PRUNE_SLACK = 1024



class Paced(Protocol):
    """What a run's stream pacer (``api/pacing.py``) tells the upstream reads."""

    #: Whether the streams wait a window between a client write and their next read.
    behind: bool


@final
class _Unpaced:
    """No pacer in this run: never behind."""

    behind = False


@final
class ReadWatch(_watch.Watched):
    """One body's read timeout, as the watchdog sees it.

    Attributes:
        fd: the socket the body reads (what firing wakes).
        timeout_s: how long one wait may last (seconds).
        since: trio time at which the current wait began; ``inf`` when not waiting. The
            reader sets and clears it around each wait.
        fired: set by the watchdog when a wait outlasted ``timeout_s`` (the reader then
            raises a timeout, not a connection error).
        closed: set by :meth:`Watchdog.unwatch`; the watchdog drops the body.
        dog: the run's watchdog (its :attr:`Watchdog.pacer`, read per read behind).
    """

    __slots__ = ("dog", "fd", "fired")

    def __init__(self, dog: Watchdog, fd: int, timeout_s: float, deadline: float) -> None:
        super().__init__(timeout_s, deadline)
        self.dog = dog
        self.fd = fd
        self.fired = False


@final
class Watchdog(_watch.Watchdog[ReadWatch]):
    """Times out the waits of every body registered with it (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self._live = 0
        self._stale = 0  # closed watches still in the heap
        #: The run's stream pacer (``http1.set_pacer``): while it holds the streams, a
        #: read behind takes no extra scheduler pass (an attribute, not a RunVar lookup
        #: per read: a RunVar's miss raises).
        self.pacer: Paced = _Unpaced()

    def watch(self, fd: int, timeout_s: float, deadline: float = _watch.INF) -> ReadWatch:
        """Register a body reading ``fd`` whose waits may last ``timeout_s`` each, and
        none past ``deadline`` (trio time; the stream's total bound)."""
        watch = ReadWatch(self, fd, timeout_s, deadline)
        self._push(min(trio.current_time() + timeout_s, deadline), watch)
        self._live += 1
        return watch

    def rearm(self, watch: ReadWatch) -> None:
        """Undo a firing that came too late: the wait had already been given its bytes
        (they arrived in the same scheduler pass, and data wins, as over a cancelled
        deadline scope), so the body goes on, watched again."""
        watch.fired = watch.closed = False
        self._live += 1
        now = trio.current_time()
        self._push(min(now + watch.timeout_s, max(now, watch.deadline)), watch)

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

    def _dropped(self, watched: ReadWatch) -> None:
        self._stale -= 1

    def _fire(self, watched: ReadWatch) -> None:
        # The body closes its connection after the timeout (``closed`` is set).
        watched.fired = True
        self._live -= 1
        trio.lowlevel.notify_closing(watched.fd)


_WATCHDOG: trio.lowlevel.RunVar[Watchdog] = trio.lowlevel.RunVar("triogate_read_watchdog")


def watchdog() -> Watchdog:
    """This run's watchdog, started on first use (not a checkpoint)."""
    return _watch.per_run(_WATCHDOG, Watchdog, "triogate upstream read watchdog")
