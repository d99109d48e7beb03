"""Pipeline timeouts on pooled Redis connections: one watchdog per run, not a scope per pipeline.

Every pipeline is bounded by ``command_timeout_s``. A ``trio.CancelScope`` with a
deadline per pipeline cost ~4 % of a governed request's samples at 32 connections
(entering and leaving it registers and unregisters a deadline, through trio's generator
context managers), and it almost never fires. On the common path (a free pool slot, a
pooled plain-socket connection) the only waits of a pipeline are on its connection's
socket, so the bound is kept as ``triogate/providers/watchdog.py`` keeps upstream read
timeouts: a connection is registered once, when it opens (:meth:`Watchdog.watch`), and a
pipeline only stamps :attr:`Watched.since` (the moment its ``execute`` began: the bound
covers the whole call, as the scope's did) and clears it when done. One task per trio run
keeps the watched connections in a heap by the earliest moment each could time out
(``triogate/_watch.py``, the mechanism the three watchdogs share):

* busy since ``since`` and ``since + timeout_s`` has passed: it fires
  (:attr:`Watched.fired`, then ``trio.lowlevel.notify_closing`` on the socket, which wakes
  the pipeline's wait with ``ClosedResourceError``); the client then fails the pipeline
  with "no reply within", never retries it, and closes the connection;
* busy, but since later: looked at again when that pipeline could expire;
* idle: again about a timeout from now (the soonest a pipeline starting now could expire),
  rounded down to a quarter of the timeout, so that the idle connections of a pool are
  looked at together (one wake-up of the watchdog, not one per connection).

So a pipeline fails at the moment its deadline scope would have (a busy connection's
next look is its exact expiry), and the watchdog costs a heap step per connection per
timeout period and at most a handful of wake-ups per timeout period. Pipelines that wait
for anything else (a pool slot, a new connection, TLS) keep a deadline scope
(``_resp.py``).

The task is a system task (``trio.lowlevel.spawn_system_task``): backends have no
nursery, and the watchdog lives as long as the run. It never raises; it only reads clocks
and flags and calls ``notify_closing``.
"""

from __future__ import annotations

from typing import final

import trio

from triogate import _watch


class Watched(_watch.Watched):
    """A connection as the watchdog sees it (``_resp._Connection``).

    Attributes:
        fd: the socket (what firing wakes).
        timeout_s: how long one pipeline may last.
        since: trio time its pipeline began; ``inf`` while no watched pipeline runs.
        fired: set when a pipeline outlived ``timeout_s``: the connection must be closed.
        closed: the connection is closed (or fired): the watchdog forgets it.
    """

    __slots__ = ("fd", "fired")

    def __init__(self, fd: int, timeout_s: float) -> None:
        super().__init__(timeout_s)
        self.fd = fd
        self.fired = False


@final
class Watchdog(_watch.Watchdog[Watched]):
    """Times out the pipelines of every connection registered with it (see the module).
    Closed connections leave when due (at most a timeout later)."""

    def watch(self, watched: Watched) -> None:
        """Watch a connection from now on (it is idle: ``since`` is ``inf``)."""
        self._push(self._next_look(watched, trio.current_time()), watched)

    def _next_look(self, watched: Watched, now: float) -> float:
        # Early, never late: a pipeline that begins now expires at now + timeout.
        grid = watched.timeout_s / 4
        return (now + watched.timeout_s) // grid * grid

    def _fire(self, watched: Watched) -> None:
        watched.fired = True
        trio.lowlevel.notify_closing(watched.fd)


_WATCHDOG: trio.lowlevel.RunVar[Watchdog] = trio.lowlevel.RunVar("triogate_redis_watchdog")


def current() -> Watchdog | None:
    """This run's watchdog if it was started (a connection pooled in an earlier trio run
    is watched by that run's, which no longer runs)."""
    try:
        return _WATCHDOG.get()
    except LookupError:
        return None


def watchdog() -> Watchdog:
    """This run's watchdog, started on first use (not a checkpoint)."""
    return _watch.per_run(_WATCHDOG, Watchdog, "triogate redis pipeline watchdog")
