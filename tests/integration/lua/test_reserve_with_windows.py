"""budget_reserve.lua with the principal's rate windows: one call does exactly what
budget_reserve.lua and rate_admit.lua did as two (replies and every key's state), and what
the reference models say; a refused part is that part's own error, the other part runs."""

from __future__ import annotations

import uuid

import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from triogate.batch import CommandError, RespBackend
from triogate.governance.budgets import RESERVE, SETTLE
from triogate.governance.keys import budget_keys, budget_marker
from triogate.governance.rate_limits import ADMIT

from .models import LedgerModel, WindowModel
from .support import one, run

pytestmark = pytest.mark.integration

#: Behind every server's clock: leases are judged by the caller's clock (deterministic).
BASE_MS = 1_700_000_000_000
LEASE_MS = 20_000
STEPS_MS = [0, 1, 999, 1000, 5_000, LEASE_MS, 59_000, 60_000, 61_000]

windows_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("r"), st.one_of(st.just(0), st.integers(0, 12))),
        st.tuples(st.just("t"), st.one_of(st.just(0), st.integers(0, 600))),
        st.tuples(st.just("p"), st.integers(0, 4)),
    ),
    min_size=1,
    max_size=3,
)
#: admit (a new request: tokens, cost); retry (an earlier admission, the same request id
#: again); settle (an earlier admission: mode, actual tokens, actual cost; replays happen);
#: advance the clock.
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(0, 200), st.integers(0, 90)),
        st.tuples(st.just("retry"), st.integers(0, 30)),
        st.tuples(st.just("settle"), st.integers(0, 30), st.sampled_from("aux"),
                  st.integers(0, 250), st.integers(0, 120)),
        st.tuples(st.just("advance"), st.sampled_from(STEPS_MS)),
    ),
    min_size=1,
    max_size=30,
)


async def _state(redis: RespBackend, keys: list[str]) -> list[object]:
    """Every key's type, content and TTL (to the second)."""
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
# A lease that expires (purged by the next admission), a retried admission, an undo.
@example(windows=[("p", 1), ("r", 2), ("t", 100)], max_budget=100, start=0, ttl=3_600_000,
         ops=[("admit", 50, 60), ("retry", 0), ("admit", 80, 60),
              ("advance", LEASE_MS), ("admit", 10, 60), ("settle", 2, "u", 0, 0),
              ("settle", 2, "u", 0, 0), ("advance", 61_000), ("admit", 700, 500)])
def test_one_call_is_the_two_scripts(
    redis_url: str,
    windows: list[tuple[str, int]],
    max_budget: int,
    ops: list[tuple[object, ...]],
    start: int,
    ttl: int,
) -> None:
    """Two copies of one principal (tags A and B): A admits with budget_reserve.lua and
    rate_admit.lua as two calls, B with one budget_reserve.lua carrying its windows; both
    settle the same way (as the gateway does: the windows only where they counted the
    request). Same replies (B's is A's two, one after the other), the models' replies
    (until a retry, which the models do not know), and the same state in every
    key after every step (TTLs included)."""
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
        copies[tag] = (budget, window_keys, [*budget, marker, *window_keys])
    ledger = LedgerModel(max_budget=max_budget)
    model = WindowModel(kinds=kinds, limits=[lim for _, lim in windows])

    async def main() -> None:
        redis = RespBackend(redis_url, command_timeout_s=5.0)
        now = BASE_MS + start
        # request id, its arguments, bucket, whether the windows counted it
        admitted: list[tuple[str, list[object], list[object], int, bool]] = []
        modelled = True

        async def both_ways(budget_args: list[object], rate_args: list[object]
                            ) -> tuple[list[object], list[object]]:
            budget_a, windows_a, _ = copies["A"]
            lone = await run(redis, RESERVE, budget_a, budget_args)
            rates = await run(redis, ADMIT, windows_a, rate_args)
            budget_b, windows_b, _ = copies["B"]
            both = await run(redis, RESERVE, [*budget_b, *windows_b],
                             [*budget_args, rate_args[2], *flat])
            assert isinstance(lone, list) and isinstance(rates, list), (lone, rates)
            assert both == lone + rates, op
            return lone, rates

        with trio.fail_after(60):
            for n, op in enumerate(ops):
                if op[0] == "admit":
                    rid, tokens, cost = f"r{n}", int(op[1]), int(op[2])  # type: ignore[call-overload]
                    budget_args: list[object] = [now, rid, cost, max_budget, LEASE_MS, ttl]
                    rate_args: list[object] = [now, rid, tokens, LEASE_MS, *flat]
                    lone, rates = await both_ways(budget_args, rate_args)
                    if modelled:
                        assert lone == ledger.reserve(rid, 0, cost, now, LEASE_MS), op
                        assert rates == model.admit(rid, tokens, now, LEASE_MS), op
                    admitted.append((rid, budget_args, rate_args, now // 1000, rates[0] == 1))
                elif op[0] == "retry" and admitted:
                    _, budget_args, rate_args, _, _ = admitted[
                        int(op[1]) % len(admitted)]  # type: ignore[call-overload]
                    await both_ways(budget_args, rate_args)
                    # The models know neither a second count nor a retry after settlement.
                    modelled = False
                elif op[0] == "settle" and admitted:
                    rid, _, rate_args, bucket, counted = admitted[
                        int(op[1]) % len(admitted)]  # type: ignore[call-overload]
                    estimate = rate_args[2]
                    mode, tokens, cost = op[2], op[3], op[4]
                    replies = []
                    for tag in "AB":
                        budget, _, keys = copies[tag]
                        args: list[object] = [rid, cost, ttl, 600_000]
                        if counted:
                            args += [mode, bucket, estimate, tokens, now, *kinds]
                        replies.append(await run(redis, SETTLE, keys if counted else
                                                 [*budget, keys[3]], args))
                    assert replies[0] == replies[1], op
                    if modelled:
                        assert replies[0] == ledger.settle(rid, 0, cost), op  # type: ignore[arg-type]
                        if counted:
                            model.settle(rid, mode, bucket, estimate, tokens, now)  # type: ignore[arg-type]
                elif op[0] == "advance":
                    now += int(op[1])  # type: ignore[call-overload]
                assert await _state(redis, copies["A"][2]) == await _state(
                    redis, copies["B"][2]), op
        await redis.aclose()

    trio.run(main)


async def test_a_refused_part_is_its_own_error_and_the_other_part_runs(
    redis: RespBackend,
) -> None:
    """Arguments one lone script would refuse: that part's element is the lone script's
    error reply; the other part runs (and writes) as it would alone."""
    pid = uuid.uuid4().hex
    budget = list(budget_keys("key", pid, 0).as_tuple())
    window = f"tg:{{key:{pid}}}:rl:rpm"
    keys = [*budget, window]
    good_budget = [BASE_MS, "r1", 5, 1000, LEASE_MS, 0]
    # The budget refused (a negative estimate): the window counts the request.
    reply = await run(redis, RESERVE, keys, [BASE_MS, "r1", -5, 1000, LEASE_MS, 0, 7, "r", 3])
    assert isinstance(reply, list) and len(reply) == 5
    assert isinstance(reply[0], CommandError) and "budget_reserve" in str(reply[0])
    assert reply[1:] == [1, 0, 0, 2]
    assert await one(redis, "EXISTS", budget[0]) == 0
    # The windows refused (a bad kind; a missing limit): the budget reserves.
    for bad in (["x", 3], ["r"]):
        reply = await run(redis, RESERVE, keys, [*good_budget, 7, *bad])
        assert isinstance(reply, list) and len(reply) == 4, bad
        assert reply[:3] == [1, 0, 5]
        assert isinstance(reply[3], CommandError) and "rate_admit" in str(reply[3])
    # Both refused (a bad clock is both parts' argument).
    reply = await run(redis, RESERVE, keys, ["soon", "r2", 5, 1000, LEASE_MS, 0, 7, "r", 3])
    assert isinstance(reply, list) and len(reply) == 2
    assert all(isinstance(r, CommandError) for r in reply)
    # Window arguments without window keys: the windows' refusal.
    reply = await run(redis, RESERVE, budget, [*good_budget, 7, "r", 3])
    assert isinstance(reply, list) and isinstance(reply[3], CommandError)
    # Without windows, a refusal is the whole reply, as ever.
    reply = await run(redis, RESERVE, budget, [BASE_MS, "r3", "x", 1000, LEASE_MS, 0])
    assert isinstance(reply, CommandError) and "budget_reserve" in str(reply)
    assert await one(redis, "HGET", window, "t") == b"1"
