"""Process-local governance state: what budgets and rate limits decide from when Redis is down.

With the ``fail-open`` policy, a check whose Redis call failed decides from here (and says
``degraded=True``). The state is per process and approximate, but it keeps the important
promises while Redis is away:

* budgets: the spend of each principal is learned from every successful reserve reply and
  from every settlement, so a principal already over budget is still refused;
* rate limits: this process's own admissions of the last minute are counted in the same
  sliding windows as in Redis (1 s buckets over 60 s, parallel slots with leases), so one
  process never admits more than the limits by itself.

The algorithms are the ones of the Lua scripts (``budget_reserve.lua``, ``rate_admit.lua``,
``rate_settle.lua``) in Python; the unit tests check them against the same reference
models as the scripts. Memory is bounded: each table keeps at most ``max_entries`` entries
and forgets the least recently written.

An instance belongs to the app (made in ``app.py``, passed down); nothing here is global.
Everything is sync and never blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Generic, TypeVar, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from triogate.governance.facts import Window

#: Sliding windows: buckets of BUCKET_MS, BUCKETS of them (see rate_admit.lua).
BUCKET_MS = 1000
BUCKETS = 60
PARALLEL_RETRY_MS = 1000

K = TypeVar("K")
V = TypeVar("V")


class _Bounded(Generic[K, V]):
    """A dict that forgets its least recently written entries beyond ``size``."""

    def __init__(self, size: int) -> None:
        self._size = size
        self.data: dict[K, V] = {}

    def get(self, key: K, make: Callable[[], V]) -> V:
        value = self.data.pop(key, None)
        if value is None:
            value = make()
        self.data[key] = value
        while len(self.data) > self._size:
            del self.data[next(iter(self.data))]
        return value


# --------------------------------------------------------------------------- budgets


@attrs.define
class _Account:
    """A principal's period: spend, and holds in the order they expire.

    Holds are written with ``now + lease_ms`` and one ``lease_ms`` per process, so the
    order they were taken is the order they expire: expired ones are popped from the front
    and ``reserved`` is kept as a running total, O(1) per request however many are in
    flight (summing them was O(concurrency) per request at 1,024 connections).
    """

    spend_nanousd: int = 0
    reserved_nanousd: int = 0
    holds: OrderedDict[str, tuple[int, int]] = attrs.Factory(OrderedDict)  # id -> (amount, expiry)

    def purge(self, now_ms: int) -> None:
        holds = self.holds
        while holds:
            amount, expires_ms = holds[next(iter(holds))]
            if expires_ms > now_ms:
                return
            holds.popitem(last=False)
            self.reserved_nanousd -= amount

    def release(self, request_id: str) -> None:
        hold = self.holds.pop(request_id, None)
        if hold is not None:
            self.reserved_nanousd -= hold[0]


@final
@attrs.frozen(kw_only=True)
class LocalBudgetVerdict:
    """A local budget decision for one principal (same rule as ``budget_reserve.lua``)."""

    admitted: bool
    spend_nanousd: int
    reserved_nanousd: int


@final
class LocalBudgets:
    """Approximate spend and in-process reservations per principal and budget period."""

    def __init__(self, max_entries: int) -> None:
        self._accounts: _Bounded[tuple[str, str, int], _Account] = _Bounded(max_entries)

    def observe(self, kind: str, principal_id: str, period: int, spend_nanousd: int) -> None:
        """Record the spend Redis reported (Redis is the truth: it replaces ours)."""
        self._accounts.get((kind, principal_id, period), _Account).spend_nanousd = spend_nanousd

    def spend(self, kind: str, principal_id: str, period: int) -> int:
        """What this process believes the principal spent in ``period`` (nano-USD)."""
        account = self._accounts.data.get((kind, principal_id, period))
        return account.spend_nanousd if account else 0

    def reserve(
        self,
        kind: str,
        principal_id: str,
        period: int,
        *,
        request_id: str,
        amount_nanousd: int,
        max_budget_nanousd: int,
        now_ms: int,
        lease_ms: int,
    ) -> LocalBudgetVerdict:
        """Check and reserve as ``budget_reserve.lua`` does, against local state."""
        account = self._accounts.get((kind, principal_id, period), _Account)
        account.purge(now_ms)
        spend = account.spend_nanousd
        reserved = account.reserved_nanousd
        used = spend + reserved
        held = request_id in account.holds
        over = used + amount_nanousd > max_budget_nanousd and not (
            used == 0 and spend < max_budget_nanousd
        )
        if held or over:
            return LocalBudgetVerdict(admitted=held, spend_nanousd=spend, reserved_nanousd=reserved)
        account.holds[request_id] = (amount_nanousd, now_ms + lease_ms)
        account.reserved_nanousd += amount_nanousd
        return LocalBudgetVerdict(
            admitted=True, spend_nanousd=spend, reserved_nanousd=reserved + amount_nanousd
        )

    def settle(
        self, kind: str, principal_id: str, period: int, *, request_id: str, actual_nanousd: int
    ) -> None:
        """Release the request's local hold (if any) and add its actual cost to the spend."""
        account = self._accounts.get((kind, principal_id, period), _Account)
        account.release(request_id)
        account.spend_nanousd += actual_nanousd


# --------------------------------------------------------------------------- rate windows


@final
@attrs.frozen(kw_only=True)
class LocalRateVerdict:
    """A local rate decision for one principal's windows (as ``rate_admit.lua`` returns).

    Attributes:
        admitted: every window passed (and the request is now counted).
        failed: index of the first failing window, or None.
        retry_after_ms: when the failing windows will have room (0 when admitted).
        remaining: per window, what is left (after this request when admitted).
    """

    admitted: bool
    failed: int | None
    retry_after_ms: int
    remaining: tuple[int, ...]


@final
class LocalWindows:
    """Sliding windows (1 s buckets over 60 s) and parallel slots, in process memory."""

    def __init__(self, max_entries: int) -> None:
        self._counts: _Bounded[str, dict[int, int]] = _Bounded(max_entries)
        #: Parallel slots per window in the order they expire (one ``lease_ms`` per
        #: process): expired ones leave from the front, live ones are counted by len().
        self._slots: _Bounded[str, OrderedDict[str, int]] = _Bounded(max_entries)

    def _live_slots(self, key: str, now_ms: int) -> OrderedDict[str, int] | None:
        slots = self._slots.data.get(key)
        while slots and slots[next(iter(slots))] <= now_ms:
            slots.popitem(last=False)
        return slots

    def used(self, window: Window, now_ms: int) -> int:
        """Requests or tokens counted in the window now, or live slots."""
        if window.kind == "parallel":
            slots = self._live_slots(window.key, now_ms)
            return len(slots) if slots else 0
        oldest = now_ms // BUCKET_MS - BUCKETS + 1
        counts = self._counts.data.get(window.key, {})
        return sum(c for b, c in counts.items() if b >= oldest)

    def admit(
        self,
        windows: Sequence[Window],
        *,
        request_id: str,
        estimate_tokens: int,
        now_ms: int,
        lease_ms: int,
    ) -> LocalRateVerdict:
        """Check every window and count the request if all pass (``rate_admit.lua``'s rule).

        Admissions decided by Redis are mirrored with :meth:`count` instead, so the local
        windows know this process's recent traffic when Redis goes away.
        """
        used = [self.used(w, now_ms) for w in windows]
        failed: int | None = None
        retry_ms = 0
        for i, (w, u) in enumerate(zip(windows, used, strict=True)):
            wait: int | None = None
            if w.kind == "rpm" and u + 1 > w.limit:
                wait = self._retry_after(w.key, u + 1 - w.limit, now_ms)
            elif w.kind == "tpm" and u + estimate_tokens > w.limit and u > 0:
                wait = self._retry_after(w.key, min(u, u + estimate_tokens - w.limit), now_ms)
            elif w.kind == "parallel" and u + 1 > w.limit:
                wait = PARALLEL_RETRY_MS
            if wait is not None:
                failed = i if failed is None else failed
                retry_ms = max(retry_ms, wait)
        if failed is not None:
            return LocalRateVerdict(
                admitted=False,
                failed=failed,
                retry_after_ms=retry_ms,
                remaining=tuple(max(w.limit - u, 0) for w, u in zip(windows, used, strict=True)),
            )
        self.count(windows, request_id=request_id, estimate_tokens=estimate_tokens,
                   now_ms=now_ms, lease_ms=lease_ms)
        remaining = [
            max(w.limit - u - (1 if w.kind != "tpm" else estimate_tokens), 0)
            for w, u in zip(windows, used, strict=True)
        ]
        return LocalRateVerdict(
            admitted=True, failed=None, retry_after_ms=0, remaining=tuple(remaining)
        )

    def count(
        self,
        windows: Sequence[Window],
        *,
        request_id: str,
        estimate_tokens: int,
        now_ms: int,
        lease_ms: int,
    ) -> None:
        """Count the request in every window whatever they say, deciding nothing.

        How admissions decided by Redis are mirrored here (every governed request, once
        per principal with windows), so it reads no window's total: ``used()`` sums up to
        60 buckets per window, and the totals only served a verdict Redis already gave.
        Buckets that left the window are dropped when a new bucket begins (once a second
        per window), not on every call: ``used()`` and ``_retry_after`` skip them anyway,
        and the table stays bounded.
        """
        current = now_ms // BUCKET_MS
        for w in windows:
            if w.kind == "parallel":
                self._live_slots(w.key, now_ms)  # expired slots leave first, as in admit
                slots = self._slots.get(w.key, OrderedDict)
                slots[request_id] = now_ms + lease_ms
                slots.move_to_end(request_id)
                continue
            add = 1 if w.kind == "rpm" else estimate_tokens
            counts = self._counts.get(w.key, dict)
            if current not in counts:
                oldest = current - BUCKETS + 1
                for b in [b for b in counts if b < oldest]:
                    del counts[b]
                if not add:
                    continue
                counts[current] = add
            elif add:
                counts[current] += add

    def settle(
        self,
        windows: Sequence[Window],
        *,
        request_id: str,
        mode: str,
        bucket: int,
        estimate_tokens: int,
        actual_tokens: int,
        now_ms: int,
    ) -> None:
        """Apply a settlement as ``rate_settle.lua`` does (modes ``a``, ``u``, ``x``)."""
        in_window = bucket > now_ms // BUCKET_MS - BUCKETS
        for w in windows:
            if w.kind == "parallel":
                slots = self._slots.data.get(w.key)
                if slots is not None:
                    slots.pop(request_id, None)
                continue
            delta = 0
            if mode == "u":
                delta = -1 if w.kind == "rpm" else -estimate_tokens
            elif mode == "a" and w.kind == "tpm":
                delta = actual_tokens - estimate_tokens
            if delta == 0 or not in_window:
                continue
            counts = self._counts.get(w.key, dict)
            value = counts.get(bucket, 0) + delta
            if value > 0:
                counts[bucket] = value
            else:
                counts.pop(bucket, None)

    def _retry_after(self, key: str, need: int, now_ms: int) -> int:
        oldest = now_ms // BUCKET_MS - BUCKETS + 1
        freed = 0
        for b, c in sorted(self._counts.data.get(key, {}).items()):
            if b < oldest:
                continue
            freed += c
            if freed >= need:
                return (b + BUCKETS) * BUCKET_MS - now_ms
        return BUCKETS * BUCKET_MS


# --------------------------------------------------------------------------- both


@final
class LocalGovernance:
    """The process-local state of budgets and rate limits (one per gateway process).

    Args:
        max_entries: bound on each table (principal-periods, windows, slot sets).
    """

    def __init__(self, *, max_entries: int = 100_000) -> None:
        self.budgets = LocalBudgets(max_entries)
        self.windows = LocalWindows(max_entries)
