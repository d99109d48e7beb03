"""The admission gate: how many requests of one worker run their pre-call checks at once.

A worker is one thread. Its pre-call phase (auth, budgets, rate limits, routing, the cache
lookup: one batch scope and one Redis round trip) is CPU work plus one wait; a request
waiting on its upstream costs nothing. Without a bound, a burst of 1,000 requests all
enter the pre-call phase together: each Redis round trip then waits behind the other
999 tasks' CPU work to be read, the pipelines outlast ``redis.command_timeout_s`` while
Redis itself is idle, and the checks *fail open* (seen at 1,024 connections once the
HTTP server stopped throttling reads). The gate keeps ``triogate.max_admitting``
requests in that phase; the others wait in arrival order (a parked task costs no CPU)
for at most ``triogate.max_admission_wait_s``, then get 503 with ``Retry-After``.

Why a bound on the *phase* and not on requests in flight: an LLM call takes seconds,
and a stream minutes, while the gateway's work on it takes about a millisecond. A cap on
requests in flight that protects the CPU (a few hundred) would cap a worker at a few
hundred streams or slow calls; ``triogate.max_in_flight`` stays as the outer cap on
memory and connections, refusing at once beyond it.
"""

from __future__ import annotations

import trio

from triogate.api.errors import ApiError


class AdmissionGate:
    """At most ``limit`` requests admitting at once; others wait up to ``wait_s``.

    ``limit`` 0: no gate. Counters for tests and metrics: :attr:`admitting`,
    :attr:`peak`, :attr:`waited` (requests that found no free slot), :attr:`refused`.
    """

    def __init__(self, limit: int, wait_s: float) -> None:
        self.limit = limit
        self.wait_s = wait_s
        self._slots = trio.Semaphore(limit) if limit > 0 else None
        self.admitting = 0
        self.peak = 0
        self.waited = 0
        self.refused = 0

    async def enter(self) -> bool:
        """Take a slot (FIFO among waiters); False if none came free within ``wait_s``.

        A slot taken must be given back with :meth:`leave`.
        """
        slots = self._slots
        if slots is None:
            return True
        try:
            slots.acquire_nowait()  # trio hands a released slot to the first waiter
        except trio.WouldBlock:
            self.waited += 1
            with trio.move_on_after(self.wait_s):
                await slots.acquire()
                self._count()
                return True
            self.refused += 1
            return False
        self._count()
        return True

    def leave(self) -> None:
        """Give a slot back."""
        if self._slots is not None:
            self.admitting -= 1
            self._slots.release()

    def _count(self) -> None:
        self.admitting += 1
        if self.admitting > self.peak:
            self.peak = self.admitting


def overloaded(style: str, message: str) -> ApiError:
    """503 with ``Retry-After`` in the API's own shape (Anthropic calls it ``overloaded_error``)."""
    return ApiError(503, message,
                    "overloaded_error" if style == "anthropic" else "service_unavailable",
                    code="overloaded", headers={"retry-after": "1"})
