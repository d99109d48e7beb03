"""Reference models of the governance scripts: the specification, written as plainly as possible.

They keep a log (one entry per counted request, one per reservation) instead of buckets
and counters, so they share no code and no representation with the Lua scripts or with
``triogate.governance.local``. Property tests run random operations through a model and
through the real thing and compare every reply and every counter.
"""

from __future__ import annotations

import attrs

BUCKET_MS = 1000
BUCKETS = 60
PARALLEL_RETRY_MS = 1000


# --------------------------------------------------------------------------- rate windows


@attrs.define
class Counted:
    """One request counted in one window: ``amount`` requests or tokens in ``bucket``."""

    request_id: str
    window: int
    bucket: int
    amount: int


@attrs.define
class WindowModel:
    """One principal's windows: ``kinds[i]`` in ``r``/``t``/``p`` with ``limits[i]``."""

    kinds: list[str]
    limits: list[int]
    log: list[Counted] = attrs.Factory(list)
    slots: dict[str, int] = attrs.Factory(dict)  # request id -> lease expiry ms
    settled: set[str] = attrs.Factory(set)

    def used(self, i: int, now_ms: int) -> int:
        """Requests or tokens of window ``i`` in (now - 60 s buckets], or live slots."""
        if self.kinds[i] == "p":
            return sum(1 for expiry in self.slots.values() if expiry > now_ms)
        current = now_ms // BUCKET_MS
        return sum(
            c.amount for c in self.log if c.window == i and c.bucket > current - BUCKETS
        )

    def _retry_after(self, i: int, need: int, now_ms: int) -> int:
        current = now_ms // BUCKET_MS
        per_bucket: dict[int, int] = {}
        for c in self.log:
            if c.window == i and c.bucket > current - BUCKETS:
                per_bucket[c.bucket] = per_bucket.get(c.bucket, 0) + c.amount
        freed = 0
        for bucket in sorted(per_bucket):
            freed += per_bucket[bucket]
            if freed >= need:
                return (bucket + BUCKETS) * BUCKET_MS - now_ms
        return BUCKETS * BUCKET_MS

    def admit(
        self, request_id: str, estimate: int, now_ms: int, lease_ms: int
    ) -> list[int]:
        """The reply ``rate_admit.lua`` must give: admitted, failed, retry, remaining..."""
        used = [self.used(i, now_ms) for i in range(len(self.kinds))]
        failed, retry = 0, 0
        for i, (kind, limit) in enumerate(zip(self.kinds, self.limits, strict=True)):
            u = used[i]
            wait = None
            if kind == "r" and u + 1 > limit:
                wait = self._retry_after(i, u + 1 - limit, now_ms)
            elif kind == "t" and u + estimate > limit and u > 0:
                wait = self._retry_after(i, min(u, u + estimate - limit), now_ms)
            elif kind == "p" and u + 1 > limit:
                wait = PARALLEL_RETRY_MS
            if wait is not None:
                failed = failed or i + 1
                retry = max(retry, wait)
        if failed:
            left = (max(lim - u, 0) for lim, u in zip(self.limits, used, strict=True))
            return [0, failed, retry, *left]
        remaining = []
        for i, (kind, limit) in enumerate(zip(self.kinds, self.limits, strict=True)):
            if kind == "p":
                self.slots = {r: e for r, e in self.slots.items() if e > now_ms}
                self.slots[request_id] = now_ms + lease_ms
                remaining.append(max(limit - used[i] - 1, 0))
            else:
                amount = 1 if kind == "r" else estimate
                self.log.append(Counted(request_id, i, now_ms // BUCKET_MS, amount))
                remaining.append(max(limit - used[i] - amount, 0))
        return [1, 0, 0, *remaining]

    def settle(
        self, request_id: str, mode: str, bucket: int, estimate: int, actual: int, now_ms: int
    ) -> int:
        """What ``rate_settle.lua`` must do; returns 1, or 0 for a replay."""
        if request_id in self.settled:
            return 0
        self.settled.add(request_id)
        self.slots.pop(request_id, None)
        in_window = bucket > now_ms // BUCKET_MS - BUCKETS
        for c in self.log:
            if c.request_id != request_id or not in_window:
                continue
            if mode == "u":
                c.amount = 0
            elif mode == "a" and self.kinds[c.window] == "t":
                c.amount = actual
        return 1


# --------------------------------------------------------------------------- budgets


@attrs.define
class Reservation:
    request_id: str
    period: int
    amount: int
    expiry_ms: int


@attrs.define
class LedgerModel:
    """One principal's budget: spend per period, and the reservations in flight."""

    max_budget: int
    spend: dict[int, int] = attrs.Factory(dict)
    reservations: list[Reservation] = attrs.Factory(list)
    settled: set[str] = attrs.Factory(set)

    def reserved(self, period: int) -> int:
        return sum(r.amount for r in self.reservations if r.period == period)

    def reserve(
        self, request_id: str, period: int, estimate: int, now_ms: int, lease_ms: int
    ) -> list[int]:
        """The reply ``budget_reserve.lua`` must give: admitted, spend, reserved."""
        self.reservations = [
            r for r in self.reservations if r.period != period or r.expiry_ms > now_ms
        ]
        spend, reserved = self.spend.get(period, 0), self.reserved(period)
        if any(r.request_id == request_id and r.period == period for r in self.reservations):
            return [1, spend, reserved]
        used = spend + reserved
        if used + estimate <= self.max_budget or (used == 0 and spend < self.max_budget):
            self.reservations.append(Reservation(request_id, period, estimate, now_ms + lease_ms))
            return [1, spend, reserved + estimate]
        return [0, spend, reserved]

    def settle(self, request_id: str, period: int, actual: int) -> list[int]:
        """What ``budget_settle.lua`` must do: applied, released, spend."""
        if request_id in self.settled:
            return [0, 0, self.spend.get(period, 0)]
        self.settled.add(request_id)
        released = sum(
            r.amount for r in self.reservations if r.request_id == request_id and r.period == period
        )
        self.reservations = [
            r for r in self.reservations if not (r.request_id == request_id and r.period == period)
        ]
        self.spend[period] = self.spend.get(period, 0) + actual
        return [1, released, self.spend[period]]
