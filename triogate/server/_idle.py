"""Keep-alive timeouts: one watchdog per server, not a deadline moved twice per request.

A kept-alive connection may idle for ``keep_alive_s`` between requests. Moving its
timer's deadline there when it starts to idle, and back to infinity when a request
arrives, cost two deadline changes per request (each one trio's
``_might_change_registered_deadline`` generator and a re-registration of the deadline,
~1.3 % of a governed request's samples). A connection now stamps :attr:`Idle.since` when
it starts to idle and clears it when bytes arrive, and the server's watchdog task keeps
its connections in a heap by the earliest moment each could expire:

* idle since ``since``, and ``since + keep_alive_s`` has passed: its timer is cancelled,
  as the deadline would have done (the connection closes);
* idle, but since later: looked at again when that idle spell could expire;
* busy: again a whole ``keep_alive_s`` from now.

So an idle connection closes at the moment its deadline would have closed it, and a busy
one costs the watchdog one heap step per ``keep_alive_s`` (75 s by default).
"""

from __future__ import annotations

import heapq
import math
from typing import final

import trio

_INF = math.inf


class Idle:
    """What the watchdog reads on a connection.

    Attributes:
        since: trio time the connection began to idle; ``inf`` while it is not idle.
        ended: the connection is closed: the watchdog forgets it.
        timer: the connection's scope, cancelled when it idled past the keep-alive.
    """

    __slots__ = ("ended", "since", "timer")

    def __init__(self) -> None:
        self.since = _INF
        self.ended = False
        self.timer = trio.CancelScope()


@final
class IdleWatchdog:
    """Closes the connections that idle past ``keep_alive_s`` (see the module)."""

    def __init__(self, keep_alive_s: float) -> None:
        self.keep_alive_s = keep_alive_s
        # (due, sequence, connection); an ended connection leaves when due.
        self._heap: list[tuple[float, int, Idle]] = []
        self._seq = 0
        self._sleep = trio.CancelScope()

    def watch(self, conn: Idle) -> None:
        """Watch a new connection (not idle yet). Without a positive keep-alive there is
        nothing to watch: the connection closes as soon as it idles (``_connection.py``)."""
        if self.keep_alive_s > 0:
            self._push(trio.current_time() + self.keep_alive_s, conn)

    def _push(self, due: float, conn: Idle) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, conn))
        if due < self._sleep.deadline:
            self._sleep.deadline = due

    async def run(self) -> None:
        """Sleep until the first due connection, look at the due ones; until cancelled."""
        while True:
            self._sleep = trio.CancelScope(deadline=self._heap[0][0] if self._heap else _INF)
            with self._sleep:
                await trio.sleep_forever()
            self._expire(trio.current_time())

    def _expire(self, now: float) -> None:
        heap = self._heap
        keep_alive_s = self.keep_alive_s
        while heap and heap[0][0] <= now:
            _, _, conn = heapq.heappop(heap)
            if conn.ended:
                continue
            since = conn.since
            if since == _INF:
                self._push(now + keep_alive_s, conn)
            elif since + keep_alive_s > now:
                self._push(since + keep_alive_s, conn)
            else:
                conn.ended = True
                conn.timer.cancel()
