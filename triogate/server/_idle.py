"""Keep-alive timeouts: one watchdog per server, not a deadline moved twice per request.

A kept-alive connection may idle for ``keep_alive_s`` between requests. Moving its
timer's deadline there when it starts to idle, and back to infinity when a request
arrives, cost two deadline changes per request (each one trio's
``_might_change_registered_deadline`` generator and a re-registration of the deadline,
~1.3 % of a governed request's samples). A connection now stamps :attr:`Idle.since` when
it starts to idle and clears it when bytes arrive, and the server's watchdog task keeps
its connections in a heap by the earliest moment each could expire (``triogate/_watch.py``,
the mechanism the three watchdogs share):

* idle since ``since``, and ``since + keep_alive_s`` has passed: its timer is cancelled,
  as the deadline would have done (the connection closes);
* idle, but since later: looked at again when that idle spell could expire;
* busy: again a whole ``keep_alive_s`` from now.

So an idle connection closes at the moment its deadline would have closed it, and a busy
one costs the watchdog one heap step per ``keep_alive_s`` (75 s by default).
"""

from __future__ import annotations

from typing import final

import trio

from triogate import _watch


class Idle(_watch.Watched):
    """What the watchdog reads on a connection.

    Attributes:
        since: trio time the connection began to idle; ``inf`` while it is not idle.
        timeout_s: the keep-alive (set by :meth:`IdleWatchdog.watch`).
        closed: the connection is closed (or idled out): the watchdog forgets it.
        timer: the connection's scope, cancelled when it idled past the keep-alive.
    """

    __slots__ = ("timer",)

    def __init__(self) -> None:
        super().__init__(_watch.INF)
        self.timer = trio.CancelScope()


@final
class IdleWatchdog(_watch.Watchdog[Idle]):
    """Closes the connections that idle past ``keep_alive_s`` (see the module); an ended
    connection leaves the heap when due."""

    def __init__(self, keep_alive_s: float) -> None:
        super().__init__()
        self.keep_alive_s = keep_alive_s

    def watch(self, conn: Idle) -> None:
        """Watch a new connection (not idle yet). Without a positive keep-alive there is
        nothing to watch: the connection closes as soon as it idles (``_connection.py``)."""
        if self.keep_alive_s > 0:
            conn.timeout_s = self.keep_alive_s
            self._push(trio.current_time() + self.keep_alive_s, conn)

    def _fire(self, watched: Idle) -> None:
        watched.timer.cancel()
