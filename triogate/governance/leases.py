"""Leases held by a running request, renewed while it runs.

Admission leaves leases behind in Redis: a budget reservation per budgeted principal
(``budget_reserve.lua``) and a parallel-request slot per principal with
``max_parallel_requests`` (``rate_admit.lua``). A lease lets the next script purge what
a dead process held; it runs ``lease_ms`` (``triogate.governance.lease_s``). A call or a
stream that outlives it would lose its reservation and its slot to the next request, so
:func:`kept` renews them, every third of a lease, for as long as its block runs: one
``lease_renew.lua`` per principal, all in one pipeline (one batch scope).

A renewal that fails (Redis down, a script error) is logged and tried again at the next
tick: the lease still runs until its expiry, and settlement releases it anyway.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING

import trio

from triogate.batch import BatchError, Script, open_batch_scope
from triogate.governance.keys import PARALLEL, budget_keys

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

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


async def renew(
    backends: Mapping[str, Backend], request_id: str, leases: Held, now_ms: int,
    settings: CheckSettings,
) -> int:
    """Renew every lease in ``leases`` (one round trip); how many were still held."""
    async with open_batch_scope(backends) as scope:
        parts = [
            scope.start_participant(
                partial(_renew_one, scope.batch, request_id, keys, now_ms, settings),
                name=f"lease:{kind}",
            )
            for (kind, _), keys in leases.items()
        ]
    return sum(p.result() for p in parts)


@asynccontextmanager
async def kept(
    backends: Mapping[str, Backend],
    request_id: str,
    leases: Held,
    settings: CheckSettings,
    clock_ms: Callable[[], int],
    *,
    interval_s: float | None = None,
) -> AsyncIterator[None]:
    """Renew ``leases`` every ``interval_s`` (a third of the lease) while the block runs."""
    if not leases:
        yield
        return
    every_s = interval_s if interval_s is not None else settings.lease_ms / 3000

    async def loop() -> None:
        while True:
            await trio.sleep(every_s)
            try:
                # Bounded: a renewal stuck on a dead Redis must not outlive its tick.
                with trio.move_on_after(every_s):
                    await renew(backends, request_id, leases, clock_ms(), settings)
            except (BatchError, ValueError, TypeError) as exc:
                logger.warning("lease renewal failed; retried next tick: %s", exc,
                               extra={"trace_id": request_id})

    # The block's own exception leaves as it came (not wrapped in an ExceptionGroup).
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop)
        try:
            yield
        except BaseException as exc:  # re-raised below, unwrapped
            error = exc
        finally:
            nursery.cancel_scope.cancel()
    if error is not None:
        raise error
