"""Leases held by a running request, renewed while it runs.

Admission leaves leases behind in Redis: a budget reservation per budgeted principal
(``budget_reserve.lua``) and a parallel-request slot per principal with
``max_parallel_requests`` (``rate_admit.lua``). A lease lets the next script purge what
a dead process held; it runs ``lease_ms`` (``triogate.governance.lease_s``). A call or a
stream that outlives it would lose its reservation and its slot to the next request, so
:class:`LeaseKeeper` renews them, every third of a lease, for as long as the request's
block runs: one ``lease_renew.lua`` per principal, all in one pipeline (one batch scope)
for all the requests in flight. One task for the process, not one per request: a
request's own cost is a dict entry.

A renewal that fails (Redis down, a script error) is logged and tried again at the next
tick: the lease still runs until its expiry, and settlement releases it anyway.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, final

import trio

from triogate.batch import BatchError, Script, open_batch_scope
from triogate.governance.keys import PARALLEL, budget_keys

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from triogate.batch import Backend, Batch
    from triogate.governance.budgets import BudgetReservation
    from triogate.governance.facts import CheckSettings
    from triogate.governance.rate_limits import RateAdmission

OWNER = "leases"
RENEW = Script.from_package("triogate.lua", "lease_renew.lua")

#: How long a parallel window key lives past its newest lease (rate_admit.lua's TTL).
WINDOW_TTL_MS = 120_000

logger = logging.getLogger("triogate.governance.leases")

#: Per principal (kind, id): the lease keys and, per key, how long it must live at least.
Held = dict[tuple[str, str], list[tuple[str, int]]]


def held(
    reservation: BudgetReservation | None, admission: RateAdmission | None, lease_ms: int
) -> Held:
    """The lease keys a request may hold in Redis, grouped by principal (one hash tag)."""
    out: Held = {}
    if reservation is not None:
        for hold in reservation.holds:
            if hold.settle_needed:
                keys = budget_keys(hold.kind, hold.id, hold.period)
                out.setdefault((hold.kind, hold.id), []).append((keys.leases, 0))
    if admission is not None:
        for entry in admission.entries:
            if not (entry.counted or entry.degraded):
                continue
            for window in entry.windows:
                if window.kind == PARALLEL:
                    out.setdefault((entry.kind, entry.id), []).append(
                        (window.key, lease_ms + WINDOW_TTL_MS))
    return out


async def _renew_one(
    batch: Batch, request_id: str, keys: list[tuple[str, int]], now_ms: int,
    settings: CheckSettings,
) -> int:
    handle = batch.call(
        RENEW,
        keys=[k for k, _ in keys],
        args=[request_id, now_ms, settings.lease_ms, *(keep for _, keep in keys)],
        backend=settings.backend,
        owner=OWNER,
    )
    reply = await handle
    return int(reply) if isinstance(reply, int) else 0


@final
class LeaseKeeper:
    """Renews the leases of every request in flight, from one task for the process.

    A request registers a thunk for its leases (:meth:`kept`: a dict entry, no task, no
    cancel scope); :meth:`run`, in the app nursery, wakes every ``interval_s`` (a third
    of the lease) and renews, in one batch scope (one round trip), the leases of every
    request registered at least half an interval ago: a request is renewed at most
    1.5 intervals after it started, then every interval, well within the lease. The
    thunk runs only then, so a request shorter than that computes nothing.
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        settings: CheckSettings,
        clock_ms: Callable[[], int],
        *,
        interval_s: float | None = None,
    ) -> None:
        self._backends = backends
        self._settings = settings
        self._clock_ms = clock_ms
        self.interval_s = interval_s if interval_s is not None else settings.lease_ms / 3000
        self._running: dict[object, tuple[str, Callable[[], Held], float]] = {}
        #: Renewal rounds run so far (tests read it).
        self.rounds = 0

    def in_flight(self) -> int:
        """Requests registered now."""
        return len(self._running)

    def kept(self, request_id: str, leases: Callable[[], Held]) -> _Kept:
        """Keep ``leases()`` renewed while the ``with`` block runs."""
        return _Kept(self._running, (request_id, leases, trio.current_time()))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            try:
                # Bounded: a renewal stuck on a dead Redis must not outlive its tick.
                with trio.move_on_after(self.interval_s):
                    await self.renew_due()
            except (BatchError, ValueError, TypeError) as exc:
                logger.warning("lease renewal failed; retried next tick: %s", exc)

    async def renew_due(self) -> int:
        """Renew the leases of the requests due (one round trip); how many were held."""
        oldest = trio.current_time() - self.interval_s / 2
        due = [(request_id, leases()) for request_id, leases, since
               in list(self._running.values()) if since <= oldest]
        due = [(request_id, held) for request_id, held in due if held]
        if not due:
            return 0
        self.rounds += 1
        now_ms = self._clock_ms()
        async with open_batch_scope(self._backends) as scope:
            parts = [
                scope.start_participant(
                    partial(_renew_one, scope.batch, request_id, keys, now_ms, self._settings),
                    name=f"lease:{kind}",
                )
                for request_id, held in due
                for (kind, _), keys in held.items()
            ]
        return sum(p.result() for p in parts)


@final
class _Kept:
    """:meth:`LeaseKeeper.kept`'s context manager: a class, not a generator one, since
    every governed request enters it once (the generator costs more than the body)."""

    __slots__ = ("_entry", "_running")

    def __init__(self, running: dict[object, tuple[str, Callable[[], Held], float]],
                 entry: tuple[str, Callable[[], Held], float]) -> None:
        self._running = running
        self._entry = entry

    def __enter__(self) -> None:
        self._running[self] = self._entry

    def __exit__(self, *exc_info: object) -> None:
        del self._running[self]
