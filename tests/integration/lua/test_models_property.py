"""Property: random admit / settle / replay / advance-time sequences give the same replies and
the same counters in the Lua scripts (real server) and in the reference models."""

from __future__ import annotations

import uuid

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triogate.batch import RespBackend
from triogate.governance.budgets import RESERVE
from triogate.governance.budgets import SETTLE as BUDGET_SETTLE
from triogate.governance.keys import budget_keys, budget_marker, rate_marker
from triogate.governance.principals import Limits
from triogate.governance.rate_limits import ADMIT
from triogate.governance.rate_limits import SETTLE as RATE_SETTLE

from .models import LedgerModel, WindowModel
from .support import hash_ints, one, run, window_buckets

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000
LEASE_MS = 20_000
#: Time steps that land on the edges: a bucket's last ms, a lease's end, 59 and 60 s.
STEPS_MS = [0, 1, 499, 999, 1000, 5_000, LEASE_MS - 1, LEASE_MS, 58_999, 59_000, 60_000, 61_000]

windows_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("r"), st.integers(0, 12)),
        st.tuples(st.just("t"), st.integers(0, 600)),
        st.tuples(st.just("p"), st.integers(0, 4)),
    ),
    min_size=1,
    max_size=4,
)
admit_op = st.tuples(st.just("admit"), st.integers(0, 200))
rate_ops = st.lists(
    st.one_of(
        admit_op,
        admit_op,
        st.tuples(st.just("settle"), st.integers(0, 50), st.sampled_from("aux"),
                  st.integers(0, 250)),
        st.tuples(st.just("replay"), st.integers(0, 50)),
        st.tuples(st.just("advance"), st.sampled_from(STEPS_MS)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows=windows_strategy, ops=rate_ops, start=st.integers(0, 999))
def test_rate_scripts_match_the_sliding_window_model(
    redis_url: str,
    windows: list[tuple[str, int]],
    ops: list[tuple[object, ...]],
    start: int,
) -> None:
    kinds = [k for k, _ in windows]
    limits = [lim for _, lim in windows]
    pid = uuid.uuid4().hex
    keys = [f"tg:{{key:{pid}}}:w{i}" for i in range(len(windows))]
    model = WindowModel(kinds=kinds, limits=limits)

    async def main() -> None:
        redis = RespBackend(redis_url, command_timeout_s=5.0)
        now = BASE_MS + start
        counted: list[tuple[str, int, int]] = []  # (request id, bucket, estimate)
        settled: list[tuple[str, list[object]]] = []
        flat: list[object] = []
        for kind, limit in windows:
            flat += [kind, limit]
        with trio.fail_after(30):
            for n, op in enumerate(ops):
                if op[0] == "admit":
                    estimate = int(op[1])  # type: ignore[call-overload]
                    rid = f"r{n}"
                    reply = await run(redis, ADMIT, keys, [now, rid, estimate, LEASE_MS, *flat])
                    assert reply == model.admit(rid, estimate, now, LEASE_MS), op
                    assert isinstance(reply, list)
                    if reply[0] == 1:
                        counted.append((rid, now // 1000, estimate))
                elif op[0] == "settle" and counted:
                    rid, bucket, estimate = counted.pop(int(op[1]) % len(counted))  # type: ignore[call-overload]
                    mode, actual = str(op[2]), int(op[3])  # type: ignore[call-overload]
                    args = [rid, mode, bucket, estimate, actual, now, 600_000, *kinds]
                    marker = rate_marker("key", pid, now)
                    reply = await run(redis, RATE_SETTLE, [*keys, marker], args)
                    assert reply == model.settle(rid, mode, bucket, estimate, actual, now) == 1
                    settled.append((marker, args))
                elif op[0] == "replay" and settled:
                    marker, args = settled[int(op[1]) % len(settled)]  # type: ignore[call-overload]
                    assert await run(redis, RATE_SETTLE, [*keys, marker], args) == 0
                elif op[0] == "advance":
                    now += int(op[1])  # type: ignore[call-overload]
                # Every window holds what the model says, after every step.
                for i, (key, kind) in enumerate(zip(keys, kinds, strict=True)):
                    if kind == "p":
                        used = await one(redis, "ZCOUNT", key, f"({now}", "+inf")
                    else:
                        oldest = now // 1000 - 59
                        fields = await window_buckets(redis, key)
                        assert all(v > 0 for v in fields.values())
                        used = sum(v for b, v in fields.items() if int(b) >= oldest)
                    assert used == model.used(i, now), (op, i)
        await redis.aclose()

    trio.run(main)


reserve_op = st.tuples(st.just("reserve"), st.integers(0, 400))
ledger_ops = st.lists(
    st.one_of(
        reserve_op,
        reserve_op,
        st.tuples(st.just("settle"), st.integers(0, 50), st.integers(0, 400)),
        st.tuples(st.just("replay"), st.integers(0, 50)),
        st.tuples(
            st.just("advance"),
            st.sampled_from([0, 1, 5_000, LEASE_MS - 1, LEASE_MS, 45_000, 60_000]),
        ),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_budget=st.integers(0, 1000),
    duration_s=st.sampled_from([None, 60, 3600]),
    ops=ledger_ops,
)
def test_budget_scripts_match_the_ledger_model(
    redis_url: str, max_budget: int, duration_s: int | None, ops: list[tuple[object, ...]]
) -> None:
    pid = uuid.uuid4().hex
    limits = Limits(max_budget_nanousd=max_budget, budget_duration_s=duration_s,
                    budget_anchor_s=BASE_MS // 1000)
    model = LedgerModel(max_budget=max_budget)

    async def main() -> None:
        redis = RespBackend(redis_url, command_timeout_s=5.0)
        now = BASE_MS
        requests: list[tuple[str, int]] = []  # (request id, period), reserved or not
        settled: list[tuple[str, int, int, str]] = []
        periods: set[int] = set()
        with trio.fail_after(30):
            for n, op in enumerate(ops):
                if op[0] == "reserve":
                    rid, period = f"r{n}", limits.budget_period(now)
                    keys = budget_keys("team", pid, period).as_tuple()
                    reply = await run(
                        redis, RESERVE, keys, [now, rid, op[1], max_budget, LEASE_MS, 0]
                    )
                    assert reply == model.reserve(rid, period, int(op[1]), now, LEASE_MS), op  # type: ignore[call-overload]
                    requests.append((rid, period))
                    periods.add(period)
                elif op[0] in ("settle", "replay") and (requests if op[0] == "settle" else settled):
                    if op[0] == "settle":
                        rid, period = requests.pop(int(op[1]) % len(requests))  # type: ignore[call-overload]
                        actual = int(op[2])  # type: ignore[call-overload]
                        # A replay resends the command as declared: the same marker key.
                        marker = budget_marker("team", pid, now)
                        settled.append((rid, period, actual, marker))
                    else:
                        rid, period, actual, marker = settled[int(op[1]) % len(settled)]  # type: ignore[call-overload]
                    settle_keys = (*budget_keys("team", pid, period).as_tuple(), marker)
                    reply = await run(redis, BUDGET_SETTLE, settle_keys, [rid, actual, 0, 600_000])
                    assert reply == model.settle(rid, period, actual), op
                elif op[0] == "advance":
                    now += int(op[1])  # type: ignore[call-overload]
                for period in periods:
                    k = budget_keys("team", pid, period)
                    counters = await hash_ints(redis, k.counters)
                    holds = await hash_ints(redis, k.holds)
                    assert counters.get("spend", 0) == model.spend.get(period, 0)
                    assert counters.get("reserved", 0) == model.reserved(period)
                    assert holds == {
                        r.request_id: r.amount for r in model.reservations if r.period == period
                    }
        await redis.aclose()

    trio.run(main)


merged_ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(0, 200), st.integers(0, 400)),
        st.tuples(st.just("admit"), st.integers(0, 200), st.integers(0, 400)),
        st.tuples(st.just("settle"), st.integers(0, 50), st.sampled_from("aux"),
                  st.integers(0, 250), st.integers(0, 400)),
        st.tuples(st.just("replay"), st.integers(0, 50)),
        st.tuples(st.just("advance"), st.sampled_from(STEPS_MS)),
    ),
    max_size=50,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows=windows_strategy, max_budget=st.integers(0, 1000), ops=merged_ops,
       start=st.integers(0, 999))
def test_budget_settle_with_windows_matches_both_models(
    redis_url: str,
    windows: list[tuple[str, int]],
    max_budget: int,
    ops: list[tuple[object, ...]],
    start: int,
) -> None:
    """budget_settle.lua carrying the principal's rate windows (one script, one marker) does
    what the ledger model's settle and the window model's settle do together; a replay
    (any number of times) changes nothing at either."""
    kinds = [k for k, _ in windows]
    pid = uuid.uuid4().hex
    keys = [f"tg:{{key:{pid}}}:w{i}" for i in range(len(windows))]
    budget = budget_keys("key", pid, 0).as_tuple()
    windows_model = WindowModel(kinds=kinds, limits=[lim for _, lim in windows])
    ledger = LedgerModel(max_budget=max_budget)

    async def main() -> None:
        redis = RespBackend(redis_url, command_timeout_s=5.0)
        now = BASE_MS + start
        admitted: list[tuple[str, int, int]] = []  # (request id, bucket, estimate tokens)
        settled: list[tuple[list[object], list[object]]] = []  # (keys, args) as declared
        flat: list[object] = []
        for kind, limit in windows:
            flat += [kind, limit]
        with trio.fail_after(30):
            for n, op in enumerate(ops):
                if op[0] == "admit":
                    rid, tokens, cost = f"r{n}", int(op[1]), int(op[2])  # type: ignore[call-overload]
                    reply = await run(redis, ADMIT, keys, [now, rid, tokens, LEASE_MS, *flat])
                    assert reply == windows_model.admit(rid, tokens, now, LEASE_MS), op
                    held = await run(redis, RESERVE, budget,
                                     [now, rid, cost, max_budget, LEASE_MS, 0])
                    assert held == ledger.reserve(rid, 0, cost, now, LEASE_MS), op
                    assert isinstance(reply, list)
                    if reply[0] == 1:
                        admitted.append((rid, now // 1000, tokens))
                elif op[0] == "settle" and admitted:
                    rid, bucket, estimate = admitted.pop(int(op[1]) % len(admitted))  # type: ignore[call-overload]
                    mode, tokens, cost = str(op[2]), int(op[3]), int(op[4])  # type: ignore[call-overload]
                    settle_keys: list[object] = [*budget, budget_marker("key", pid, now), *keys]
                    args: list[object] = [rid, cost, 0, 600_000, mode, bucket, estimate, tokens,
                                          now, *kinds]
                    reply = await run(redis, BUDGET_SETTLE, settle_keys, args)
                    assert reply == ledger.settle(rid, 0, cost), op
                    assert windows_model.settle(rid, mode, bucket, estimate, tokens, now) == 1
                    settled.append((settle_keys, args))
                elif op[0] == "replay" and settled:
                    settle_keys, args = settled[int(op[1]) % len(settled)]  # type: ignore[call-overload]
                    reply = await run(redis, BUDGET_SETTLE, settle_keys, args)  # type: ignore[arg-type]
                    assert reply == [0, 0, ledger.spend.get(0, 0)], op
                elif op[0] == "advance":
                    now += int(op[1])  # type: ignore[call-overload]
                counters = await hash_ints(redis, budget[0])
                assert counters.get("spend", 0) == ledger.spend.get(0, 0)
                assert counters.get("reserved", 0) == ledger.reserved(0)
                for i, (key, kind) in enumerate(zip(keys, kinds, strict=True)):
                    if kind == "p":
                        used = await one(redis, "ZCOUNT", key, f"({now}", "+inf")
                    else:
                        oldest = now // 1000 - 59
                        fields = await window_buckets(redis, key)
                        assert all(v > 0 for v in fields.values())
                        used = sum(v for b, v in fields.items() if int(b) >= oldest)
                    assert used == windows_model.used(i, now), (op, i)
        await redis.aclose()

    trio.run(main)
