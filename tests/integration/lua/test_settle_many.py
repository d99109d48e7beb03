"""budget_settle_many.lua: one call settling many requests of one principal does exactly
what budget_settle.lua does for each of them in turn (replies and every key's state), and
what the reference models say; a refused group writes nothing."""

from __future__ import annotations

import uuid

import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from triogate.batch import CommandError, RespBackend
from triogate.governance.budgets import RESERVE, SETTLE, SETTLE_MANY
from triogate.governance.keys import budget_keys, budget_marker
from triogate.governance.rate_limits import ADMIT

from .models import LedgerModel, WindowModel
from .support import one, run

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000
LEASE_MS = 20_000
STEPS_MS = [0, 1, 999, 1000, 5_000, LEASE_MS, 59_000, 60_000, 61_000]

windows_strategy = st.lists(
    st.one_of(
        # limit 0 often: refused admissions, whose settlements create buckets
        st.tuples(st.just("r"), st.one_of(st.just(0), st.integers(0, 12))),
        st.tuples(st.just("t"), st.one_of(st.just(0), st.integers(0, 600))),
        st.tuples(st.just("p"), st.integers(0, 4)),
    ),
    max_size=3,
)
#: A settlement: which admitted request (an index, so duplicates and replays happen),
#: mode, actual tokens, actual cost.
settlement = st.tuples(st.integers(0, 30), st.sampled_from("aux"), st.integers(0, 250),
                       st.integers(0, 120))
admit = st.tuples(st.just("admit"), st.integers(0, 200), st.integers(0, 90))
group = st.tuples(st.just("group"), st.lists(settlement, min_size=1, max_size=12))
#: Admissions first (so groups have requests to settle), then anything.
ops_strategy = st.tuples(
    st.lists(admit, min_size=1, max_size=10),
    st.lists(st.one_of(admit, group, group, st.tuples(st.just("advance"),
                                                       st.sampled_from(STEPS_MS))),
             min_size=1, max_size=24),
).map(lambda parts: [*parts[0], *parts[1]])


async def _state(redis: RespBackend, keys: list[str]) -> list[object]:
    """Every key's type, content and whether it has a TTL (and its order of magnitude)."""
    out: list[object] = []
    for key in keys:
        kind = await one(redis, "TYPE", key)
        if kind == b"hash":
            flat = await one(redis, "HGETALL", key)
            assert isinstance(flat, list)
            content: object = sorted(zip(flat[::2], flat[1::2], strict=True))
        elif kind == b"zset":
            content = await one(redis, "ZRANGE", key, 0, -1, "WITHSCORES")
        else:
            content = None
        ttl = await one(redis, "PTTL", key)
        assert isinstance(ttl, int)
        out.append((kind, content, ttl if ttl < 0 else round(ttl / 1000)))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows=windows_strategy, max_budget=st.integers(0, 1000), ops=ops_strategy,
       start=st.integers(0, 999), ttl=st.sampled_from([0, 3_600_000]))
# A window created by a settlement (its admissions were refused), then deleted and
# created again within one group.
@example(windows=[("t", 0), ("r", 0)], max_budget=1000, start=0, ttl=3_600_000,
         ops=[("admit", 10, 5), ("admit", 10, 5),
              ("group", [(0, "a", 30, 1), (1, "a", 12, 2), (0, "a", 30, 1)]),
              ("group", [(1, "u", 0, 0)])])
@example(windows=[("r", 5), ("t", 100)], max_budget=1000, start=0, ttl=0,
         ops=[("admit", 10, 5), ("admit", 10, 5), ("admit", 20, 5),
              ("group", [(0, "u", 0, 0), (1, "u", 0, 0), (2, "a", 40, 3)]),
              ("advance", 61_000), ("group", [(2, "u", 0, 0)])])
def test_a_merged_group_is_the_single_calls_in_turn(
    redis_url: str,
    windows: list[tuple[str, int]],
    max_budget: int,
    ops: list[tuple[object, ...]],
    start: int,
    ttl: int,
) -> None:
    """Two copies of one principal (tags A and B) get the same admissions; each group of
    settlements (random size, duplicates, replays of earlier groups) goes to A as one
    budget_settle.lua per request and to B as one budget_settle_many.lua: same replies,
    the models' replies, and the same state in every key afterwards (TTLs included)."""
    kinds = [k for k, _ in windows]
    flat: list[object] = []
    for kind, limit in windows:
        flat += [kind, limit]
    pid = uuid.uuid4().hex
    copies = {}
    for tag in "AB":
        principal = f"{pid}{tag}"
        budget = list(budget_keys("key", principal, 0).as_tuple())
        marker = budget_marker("key", principal, BASE_MS)
        window_keys = [f"tg:{{key:{principal}}}:w{i}" for i in range(len(windows))]
        copies[tag] = (budget, [*budget, marker, *window_keys], window_keys)
    ledger = LedgerModel(max_budget=max_budget)
    model = WindowModel(kinds=kinds, limits=[lim for _, lim in windows])

    async def main() -> None:
        redis = RespBackend(redis_url, command_timeout_s=5.0)
        now = BASE_MS + start
        admitted: list[tuple[str, int, int]] = []  # request id, bucket, estimate tokens
        with trio.fail_after(60):
            for n, op in enumerate(ops):
                if op[0] == "admit":
                    rid, tokens, cost = f"r{n}", int(op[1]), int(op[2])  # type: ignore[call-overload]
                    replies = []
                    for budget, _, window_keys in copies.values():
                        if windows:
                            replies.append(await run(redis, ADMIT, window_keys,
                                                     [now, rid, tokens, LEASE_MS, *flat]))
                        replies.append(await run(redis, RESERVE, budget,
                                                 [now, rid, cost, max_budget, LEASE_MS, 0]))
                    half = len(replies) // 2
                    assert replies[:half] == replies[half:], op
                    ledger.reserve(rid, 0, cost, now, LEASE_MS)
                    if windows:
                        model.admit(rid, tokens, now, LEASE_MS)
                    admitted.append((rid, now // 1000, tokens))
                elif op[0] == "group" and admitted:
                    calls = []
                    for index, mode, tokens, cost in op[1]:  # type: ignore[attr-defined]
                        rid, bucket, estimate = admitted[index % len(admitted)]
                        args: list[object] = [rid, cost, ttl, 600_000]
                        if windows:
                            args += [mode, bucket, estimate, tokens, now, *kinds]
                        calls.append(args)
                    _, keys_a, _ = copies["A"]
                    singles = [await run(redis, SETTLE, keys_a, args) for args in calls]
                    merged_args: list[object] = []
                    for args in calls:
                        merged_args += [len(args), *args]
                    _, keys_b, _ = copies["B"]
                    merged = await run(redis, SETTLE_MANY, keys_b, merged_args)
                    assert merged == singles, op
                    for args, reply in zip(calls, singles, strict=True):
                        rid, cost = str(args[0]), int(args[1])  # type: ignore[call-overload]
                        assert reply == ledger.settle(rid, 0, cost), op
                        if windows:
                            mode, bucket, estimate, tokens = args[4:8]
                            model.settle(rid, mode, bucket, estimate, tokens, now)  # type: ignore[arg-type]
                elif op[0] == "advance":
                    now += int(op[1])  # type: ignore[call-overload]
                assert await _state(redis, copies["A"][1]) == await _state(
                    redis, copies["B"][1]), op
        await redis.aclose()

    trio.run(main)


async def test_a_refused_request_refuses_the_group_and_nothing_is_written(
    redis: RespBackend,
) -> None:
    pid = uuid.uuid4().hex
    budget = list(budget_keys("key", pid, 0).as_tuple())
    keys = [*budget, budget_marker("key", pid, BASE_MS)]
    await run(redis, RESERVE, budget, [BASE_MS, "r1", 50, 1000, LEASE_MS, 0])
    before = await _state(redis, keys)
    good = [4, "r1", 30, 0, 600_000]
    for bad in (
        [4, "r2", -1, 0, 600_000],  # negative cost
        [4, "r2", 5, 0, 0],  # marker TTL 0
        [3, "r2", 5, 0],  # too few arguments
        [9, "r2", 5, 0, 600_000, "a", 1, 2, 3, 4],  # window arguments without windows
        [5, "r2", 5, 0, 600_000],  # the count runs past the end
        ["x", "r2", 5, 0, 600_000],
    ):
        reply = await run(redis, SETTLE_MANY, keys, [*good, *bad])
        assert isinstance(reply, CommandError), bad
        assert "budget_settle_many" in str(reply)
    assert isinstance(await run(redis, SETTLE_MANY, keys, []), CommandError)
    assert isinstance(await run(redis, SETTLE_MANY, [*keys[:3], keys[0]], good), CommandError)
    assert await _state(redis, keys) == before
    # The same group, fixed, settles.
    assert await run(redis, SETTLE_MANY, keys, [*good, *good]) == [[1, 50, 30], [0, 0, 30]]
