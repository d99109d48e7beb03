"""Time-outs kept by one watchdog task instead of a deadline scope per wait.

A deadline scope entered and left per wait (a Redis pipeline, an upstream read, a
connection's keep-alive) costs dozens of Python calls in trio and a deadline
registration each time, and almost never fires. The three users of this module
(``batch/_watchdog.py``, ``providers/watchdog.py``, ``server/_idle.py``) keep their
time-outs another way: a watched thing is registered once, and each wait costs one clock
read: it stamps :attr:`Watched.since` when it begins and puts back ``inf`` when it ends.
One task keeps the watched things in a heap by the earliest moment each could time out,
and looks at one only then:

* waiting since ``since``, and ``since + timeout_s`` has passed: it fires
  (:meth:`Watchdog._fire`, the user's action) and is forgotten;
* waiting, but since later: looked at again when that wait could expire;
* not waiting: again at :meth:`Watchdog._next_look` (by default a whole timeout from now,
  the soonest a wait beginning now could expire).

So a wait fails at the moment a deadline scope would have failed it, and a watched thing
costs the watchdog one heap step per timeout period. A closed one is forgotten when it
comes due (:meth:`Watchdog._dropped` tells the user).

A leaf module (trio and the standard library only): ``batch`` and ``server`` import
nothing of the gateway, and this is not the gateway's, only the mechanism they share.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

if TYPE_CHECKING:
    from collections.abc import Callable

INF = math.inf


class Watched:
    """What a watchdog reads and writes on a watched thing.

    Attributes:
        timeout_s: how long one wait may last (seconds).
        since: trio time the current wait began; ``inf`` while not waiting.
        closed: the thing is gone, or its wait fired: the watchdog forgets it.
    """

    __slots__ = ("closed", "deadline", "since", "timeout_s")

    def __init__(self, timeout_s: float, deadline: float = INF) -> None:
        self.timeout_s = timeout_s
        self.since = INF
        self.closed = False
        #: Trio time at which a wait fires even if it began less than ``timeout_s`` ago
        #: (a total bound on the thing's life; ``inf``: none).
        self.deadline = deadline


W = TypeVar("W", bound=Watched)


class Watchdog(Generic[W]):
    """One task's heap of watched things (see the module); users override the hooks."""

    def __init__(self) -> None:
        # (due, sequence, watched): when to look at a thing next.
        self._heap: list[tuple[float, int, W]] = []
        self._seq = 0
        self._sleep = trio.CancelScope()  # its deadline: the heap's first due

    def _push(self, due: float, watched: W) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, watched))
        if due < self._sleep.deadline:
            self._sleep.deadline = due

    async def run(self) -> None:
        """Sleep until the first due thing, look at the due ones; until cancelled."""
        while True:
            self._sleep = trio.CancelScope(deadline=self._heap[0][0] if self._heap else INF)
            with self._sleep:
                await trio.sleep_forever()
            self._expire(trio.current_time())

    def _expire(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, watched = heapq.heappop(heap)
            if watched.closed:
                self._dropped(watched)
                continue
            since = watched.since
            deadline = watched.deadline
            if since == INF:
                look = self._next_look(watched, now)
                self._push(deadline if now < deadline < look else look, watched)
            elif (due := min(since + watched.timeout_s, deadline)) > now:
                self._push(due, watched)
            else:
                watched.closed = True
                self._fire(watched)

    def _next_look(self, watched: W, now: float) -> float:
        """When to look again at a thing that is not waiting."""
        return now + watched.timeout_s

    def _dropped(self, watched: W) -> None:
        """A closed thing left the heap."""

    def _fire(self, watched: W) -> None:
        """A wait outlived its timeout (``watched.closed`` is already set)."""
        raise NotImplementedError


D = TypeVar("D", bound="Watchdog[Any]")


def per_run(var: trio.lowlevel.RunVar[D], make: Callable[[], D], name: str) -> D:
    """This run's watchdog kept in ``var``, made and started as a system task on first
    use (not a checkpoint). A system task, the one per-run service trio offers: the users
    have no nursery of their own (a backend or a transport is built outside any), and a
    watchdog lives as long as the run. It never raises (a system task's exception would
    crash the run)."""
    try:
        return var.get()
    except LookupError:
        dog = make()
        var.set(dog)
        trio.lowlevel.spawn_system_task(dog.run, name=name)
        return dog
