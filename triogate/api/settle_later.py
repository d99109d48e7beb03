"""Settlement off the critical path: a complete answer's accounting runs when the worker
would otherwise wait, not between one request's answer and the next one's checks.

A complete answer is written before its request settles (``flow.SettledAfter``). At one
connection the client's next request then arrives while the worker is still settling the
last one (the post-call declarations, the cache entry, the spend-log row, metrics, the
log line: 0.3-0.4 ms on a shared 2-vCPU host), and waits for it: cut at its system calls,
the next request was read ~0.2 ms after the client wrote it (``bench/tail_timeline.py``,
``bench/results/w10-cpu.md``). Here :class:`SettleLater` queues the settlement instead,
and one task of the app nursery runs the queue when the worker has been idle for
:data:`IDLE_CUSHION_S` (at one connection: in the next request's upstream wait, after its
Redis round), or at the latest :data:`MAX_DELAY_S` after the first queued (a worker that is
never idle settles in batches, as often).

What may wait, and what may not:

* A request that holds a parallel-request slot settles at once: the client may send its
  next request as soon as it has the answer, and it must find the slot free (the settler
  sends that batch without its group-commit delay, as before).
* Everything else is the settler's to send anyway, 5 ms later (``post_call_settle_delay_s``):
  until then a budget holds the request's estimate and a TPM window its estimated tokens
  (never less than the actual cost), so a check in those few ms can only be stricter, and
  the router's view counts the request in flight a few ms longer.
* Whoever reads the accounting sees it whole: every request that is not a model call
  (admin, ``/metrics``, the dashboard) drains the queue first (``api/asgi.py``), and so
  does :meth:`Settler.wait_drained <triogate.batch.Settler.wait_drained>` (shutdown, tests)
  through its drain hook. Cancelled, the task drains what is queued before it ends.

Settling is synchronous (``settlement.settle``), so a drain cannot be interrupted half-way
and nothing queued is lost to a cancellation. The time a request ended (its latency, its
spend-log row, the clock its settlement scripts see) is taken when it is queued, and it
settles in the request's context (its log line carries its request id).
"""

from __future__ import annotations

import contextvars
import logging
from typing import TYPE_CHECKING, Protocol

import trio
import trio.testing

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger("triogate.api.settle_later")

#: The worker has been idle this long (no task runnable, no I/O ready): settle now. Longer
#: than a Redis round on a busy host, so that at one connection the settlement lands in
#: the next request's upstream wait, not in its Redis round.
IDLE_CUSHION_S = 0.002
#: At the latest this long after the first queued settlement (a worker that is never idle).
MAX_DELAY_S = 0.010
#: At most this many queued: the next one drains them at once (bounded memory, and a
#: burst does not hold thousands of settlements for the delay).
MAX_QUEUED = 256


class Settlement(Protocol):
    """A request's settlement, given when the request ended (``settlement.settle`` with
    its request bound)."""

    def __call__(self, *, ended_s: float, now_ms: int) -> None: ...


class SettleLater:
    """The queue of settlements that wait for an idle worker, and its task (the module).

    Without :meth:`run` under way (a test's bare services), :meth:`defer` settles at once.
    The caller decides what may wait (a parallel slot may not: ``flow.SettledAfter``).
    """

    def __init__(self, clock_ms: Callable[[], int], *, cushion_s: float = IDLE_CUSHION_S,
                 max_delay_s: float = MAX_DELAY_S, max_queued: int = MAX_QUEUED) -> None:
        self._clock_ms = clock_ms
        #: How long the worker must have been idle, the longest wait, the most queued
        #: (read at each wait: a test may change them).
        self.cushion_s = cushion_s
        self.max_delay_s = max_delay_s
        self.max_queued = max_queued
        self._queue: list[tuple[Settlement, float, int, str, contextvars.Context]] = []
        self._wakeup = trio.Event()
        self._running = False
        #: Settlements that were deferred, and drains that ran (counters for tests).
        self.deferred = 0
        self.drains = 0

    def defer(self, settle: Settlement, trace_id: str) -> None:
        """Run ``settle`` at the worker's next idle moment (now, if no task runs)."""
        ended_s, now_ms = trio.current_time(), self._clock_ms()
        if not self._running:
            settle(ended_s=ended_s, now_ms=now_ms)
            return
        # Its context too: the request's log line carries the request's id.
        self._queue.append((settle, ended_s, now_ms, trace_id, contextvars.copy_context()))
        self.deferred += 1
        if len(self._queue) >= self.max_queued:
            self.drain()
        elif len(self._queue) == 1:
            self._wakeup.set()

    def drain(self) -> None:
        """Settle everything queued, in order (sync; not a checkpoint)."""
        if not self._queue:
            return
        queue, self._queue = self._queue, []
        self.drains += 1
        for settle, ended_s, now_ms, trace_id, context in queue:
            try:
                context.run(settle, ended_s=ended_s, now_ms=now_ms)
            except Exception:  # a bug in one settlement must not drop the others
                logger.exception("settling a request failed", extra={"trace_id": trace_id})

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Drain the queue whenever the worker idles (or the delay is up); until
        cancelled, then drain what is left."""
        self._running = True
        task_status.started()
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                if self._queue:
                    with trio.move_on_after(self.max_delay_s):
                        await trio.testing.wait_all_tasks_blocked(self.cushion_s)
                self.drain()
        finally:
            self._running = False
            self.drain()
