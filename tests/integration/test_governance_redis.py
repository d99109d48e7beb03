"""Budgets and rate limits as participants against a real server: rounds, settlement,
concurrency across tasks and clients, failure policies, journal replay."""

from __future__ import annotations

import random
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import pytest
import trio

from tests.integration.lua.support import PAD, PAD_FIELD
from triogate.batch import (
    Batch,
    Journal,
    MemoryTracer,
    RespBackend,
    Settler,
    open_batch_scope,
    open_post_call_batch,
)
from triogate.batch.testing import FaultyBackend
from triogate.governance import budgets, rate_limits
from triogate.governance.decisions import Allowed, Rejected
from triogate.governance.facts import CheckSettings, RequestFacts
from triogate.governance.keys import budget_keys, rate_window_key
from triogate.governance.local import LocalGovernance
from triogate.governance.principals import Identity, Limits, Principal

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from triogate.batch import Backend

pytestmark = pytest.mark.integration

NOW_MS = 1_790_000_000_000
KEY_ID = "f" * 64
CHECK = CheckSettings()


def who(key: Limits, team: Limits | None = None) -> Identity:
    return Identity(
        key=Principal(kind="key", id=KEY_ID, limits=key),
        team=Principal(kind="team", id="ml", limits=team) if team else None,
    )


def facts(request_id: str, *, cost: int = 1_000, tokens: int = 100, now_ms: int = NOW_MS,
          ) -> RequestFacts:
    return RequestFacts(request_id=request_id, model_group="gpt-4o", estimate_nanousd=cost,
                        estimate_tokens=tokens, now_ms=now_ms)


async def check(
    backend: Backend, identity: Identity, request: RequestFacts, *,
    settings: CheckSettings = CHECK, local: LocalGovernance | None = None,
    tracer: MemoryTracer | None = None,
) -> tuple[budgets.BudgetOutcome, rate_limits.RateOutcome]:
    """One pre-call round, as the handler runs it (plus a cache GET)."""
    local = local or LocalGovernance()

    async def cache(batch: Batch) -> object:
        return await batch.call("GET", keys=["tg:{cache}:k"], backend="counters", owner="cache")

    async with open_batch_scope({"counters": backend}, tracer=tracer,
                                trace_id=request.request_id) as scope:
        b = scope.start_participant(budgets.reserve, scope.batch, identity, request, settings,
                                    local, name="budgets")
        r = scope.start_participant(rate_limits.admit, scope.batch, identity, request, settings,
                                    local, name="rate_limits")
        scope.start_participant(cache, scope.batch, name="cache")
    return b.result(), r.result()


async def settle(
    settler: Settler, request: RequestFacts, b: budgets.BudgetOutcome,
    r: rate_limits.RateOutcome, *, cost: int, tokens: int, admitted: bool, now_ms: int = NOW_MS,
) -> None:
    async with open_post_call_batch(settler, trace_id=request.request_id) as post:
        budgets.settle(post, b, request, actual_nanousd=cost, now_ms=now_ms)
        rate_limits.settle(post, r, request, actual_tokens=tokens, admitted=admitted,
                           now_ms=now_ms)
    await post.wait_settled()


def admitted(b: budgets.BudgetOutcome, r: rate_limits.RateOutcome) -> bool:
    return isinstance(b.decision, Allowed) and isinstance(r.decision, Allowed)


async def read(redis: RespBackend, *commands: tuple[object, ...]) -> list[object]:
    return await redis.execute(list(commands))  # type: ignore[arg-type]


async def hash_ints(redis: RespBackend, key: str) -> dict[str, int]:
    (flat,) = await read(redis, ("HGETALL", key))
    assert isinstance(flat, list)
    fields = {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)
              if flat[i] != PAD_FIELD.encode() or flat[i + 1] != PAD}
    if ":rl:" in key:  # a rate window: its buckets, once its summary is checked
        total, low = fields.pop("t", None), fields.pop("o", None)
        assert total is None or total == sum(fields.values())
        assert low is None or all(int(b) >= low for b in fields)
    return fields


@asynccontextmanager
async def running(settler: Settler) -> AsyncIterator[Settler]:
    """Run ``settler`` for the block; drain it on exit."""
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        yield settler
        await settler.wait_drained()
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- one request


async def test_one_round_before_and_exact_counters_after(redis: RespBackend) -> None:
    identity = who(Limits(max_budget_nanousd=10**9, rpm=10, tpm=10_000, max_parallel=3),
                   team=Limits(max_budget_nanousd=10**10, rpm=100))
    request = facts("req-1", cost=5_000, tokens=300)
    tracer = MemoryTracer()
    settler = Settler({"counters": redis}, tracer=tracer)
    with trio.fail_after(10):
        # Steady state: the server knows the scripts (else each owner's first EVALSHA is
        # retried as EVAL, which the tracer rightly counts as a wait of its own).
        scripts = (budgets.RESERVE, budgets.SETTLE, rate_limits.ADMIT, rate_limits.SETTLE)
        await read(redis, *(("SCRIPT", "LOAD", s.source) for s in scripts))
        b, r = await check(redis, identity, request, tracer=tracer)
        assert b.decision == Allowed()
        assert isinstance(r.decision, Allowed) and not r.decision.degraded
        assert r.decision.headers == {
            "x-ratelimit-remaining-requests": "9", "x-ratelimit-limit-requests": "10",
            "x-ratelimit-remaining-tokens": "9700", "x-ratelimit-limit-tokens": "10000",
        }
        assert b.remaining_nanousd == 10**9 - 5_000
        async with running(settler):
            await settle(settler, request, b, r, cost=4_321, tokens=250, admitted=True)
        summary = tracer.summary("req-1")
        key = budget_keys("key", KEY_ID, 0)
        team = budget_keys("team", "ml", 0)
        assert await hash_ints(redis, key.counters) == {"spend": 4_321, "reserved": 0}
        assert await hash_ints(redis, team.counters) == {"spend": 4_321, "reserved": 0}
        bucket = str(NOW_MS // 1000)
        assert await hash_ints(redis, rate_window_key("key", KEY_ID, "rpm")) == {bucket: 1}
        assert await hash_ints(redis, rate_window_key("key", KEY_ID, "tpm")) == {bucket: 250}
        assert await hash_ints(redis, rate_window_key("team", "ml", "rpm")) == {bucket: 1}
        assert await read(
            redis, ("EXISTS", key.holds, key.leases, rate_window_key("key", KEY_ID, "parallel"))
        ) == [0]
    assert (summary.waits_before, summary.waits_after) == (1, 1)


async def test_a_rejected_request_leaves_no_trace(redis: RespBackend) -> None:
    identity = who(Limits(max_budget_nanousd=10**9, rpm=10, tpm=10_000, max_parallel=3),
                   team=Limits(max_budget_nanousd=500))
    request = facts("req-1", cost=1_000)
    settler = Settler({"counters": redis})
    with trio.fail_after(10):
        # The team's period already spent its budget.
        await read(redis, ("HSET", budget_keys("team", "ml", 0).counters, "spend", 500))
        b, r = await check(redis, identity, request)
        assert isinstance(b.decision, Rejected) and "Team 'ml'" in b.decision.message
        assert isinstance(r.decision, Allowed)  # rate limits counted it at the key
        async with running(settler):
            await settle(settler, request, b, r, cost=0, tokens=0, admitted=False)
        key = budget_keys("key", KEY_ID, 0)
        assert await hash_ints(redis, key.counters) == {"reserved": 0}
        assert await read(redis, ("EXISTS", key.holds, key.leases)) == [0]
        for window in ("rpm", "tpm", "parallel"):
            assert await read(redis, ("EXISTS", rate_window_key("key", KEY_ID, window))) == [0]


async def test_settled_in_the_next_period_charges_the_period_of_admission(
    redis: RespBackend,
) -> None:
    limits = Limits(max_budget_nanousd=10_000, budget_duration_s=3600,
                    budget_anchor_s=NOW_MS // 1000)
    identity = who(limits)
    end_ms = NOW_MS + 3_600_000
    settler = Settler({"counters": redis})
    with trio.fail_after(10):
        late = facts("late", cost=6_000, now_ms=end_ms - 1)
        b, r = await check(redis, identity, late)
        assert admitted(b, r)
        async with running(settler):
            await settle(settler, late, b, r, cost=9_000, tokens=0, admitted=True,
                         now_ms=end_ms + 10)
            # The new period starts clean: a request as large as the whole budget passes.
            fresh = facts("fresh", cost=10_000, now_ms=end_ms + 20)
            b2, r2 = await check(redis, identity, fresh)
            assert admitted(b2, r2)
            await settle(settler, fresh, b2, r2, cost=1, tokens=0, admitted=True,
                         now_ms=end_ms + 30)
        old, new = budget_keys("key", KEY_ID, 0), budget_keys("key", KEY_ID, 1)
        assert await hash_ints(redis, old.counters) == {"spend": 9_000, "reserved": 0}
        assert await hash_ints(redis, new.counters) == {"spend": 1, "reserved": 0}
        (ttl,) = await read(redis, ("PTTL", new.counters))
        assert isinstance(ttl, int) and 0 < ttl <= 3_600_000 + CHECK.budget_retention_ms


async def test_settling_twice_changes_nothing_the_second_time(redis: RespBackend) -> None:
    identity = who(Limits(max_budget_nanousd=10**9, tpm=10_000, max_parallel=2))
    request = facts("req-1", cost=100, tokens=100)
    settler = Settler({"counters": redis})
    with trio.fail_after(10):
        b, r = await check(redis, identity, request)
        async with running(settler):
            await settle(settler, request, b, r, cost=70, tokens=40, admitted=True)
            state = [await hash_ints(redis, budget_keys("key", KEY_ID, 0).counters),
                     await hash_ints(redis, rate_window_key("key", KEY_ID, "tpm"))]
            for _ in range(2):
                await settle(settler, request, b, r, cost=70, tokens=40, admitted=True)
        assert state == [{"spend": 70, "reserved": 0}, {str(NOW_MS // 1000): 40}]
        assert [await hash_ints(redis, budget_keys("key", KEY_ID, 0).counters),
                await hash_ints(redis, rate_window_key("key", KEY_ID, "tpm"))] == state


# --------------------------------------------------------------------------- concurrency


@pytest.mark.parametrize("exact", [True, False], ids=["exact-estimates", "varied-estimates"])
async def test_200_concurrent_requests_never_overspend(redis: RespBackend, exact: bool) -> None:
    estimate = 1_000_000
    budget = 50 * estimate
    rng = random.Random(7)
    estimates = [estimate if exact else rng.randint(1, 2 * estimate) for _ in range(200)]
    actuals = [rng.randint(0, e) for e in estimates]
    identity = who(Limits(max_budget_nanousd=budget))
    outcomes: dict[int, tuple[budgets.BudgetOutcome, rate_limits.RateOutcome]] = {}

    async def one(i: int) -> None:
        outcomes[i] = await check(redis, identity, facts(f"r{i}", cost=estimates[i]))

    settler = Settler({"counters": redis})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(one, i)
        won = [i for i, (b, _) in outcomes.items() if isinstance(b.decision, Allowed)]
        if exact:
            assert len(won) == 50
        else:
            assert sum(estimates[i] for i in won) <= budget
            assert len(won) >= 1
        key = budget_keys("key", KEY_ID, 0)
        assert await hash_ints(redis, key.counters) == {
            "reserved": sum(estimates[i] for i in won)
        }
        async with running(settler), trio.open_nursery() as nursery:
            for i, (b, r) in outcomes.items():
                ok = i in won
                nursery.start_soon(
                    lambda i=i, b=b, r=r, ok=ok: settle(  # type: ignore[misc]
                        settler, facts(f"r{i}", cost=estimates[i]), b, r,
                        cost=actuals[i] if ok else 0, tokens=0, admitted=ok,
                    )
                )
        assert await hash_ints(redis, key.counters) == {
            "spend": sum(actuals[i] for i in won), "reserved": 0,
        }
        assert await read(redis, ("EXISTS", key.holds, key.leases)) == [0]


async def test_parallel_limit_holds_under_50_concurrent_requests(redis: RespBackend) -> None:
    identity = who(Limits(max_parallel=5))
    holding = 0
    most = 0
    admissions = 0
    settler = Settler({"counters": redis})

    async def client(i: int) -> None:
        nonlocal holding, most, admissions
        for attempt in range(6):
            request = facts(f"c{i}-{attempt}", now_ms=NOW_MS + int(trio.current_time() * 1000))
            b, r = await check(redis, identity, request)
            ok = admitted(b, r)
            if ok:
                holding += 1
                admissions += 1
                most = max(most, holding)
                await trio.sleep(0.005)
                holding -= 1
            await settle(settler, request, b, r, cost=0, tokens=0, admitted=ok)
            await trio.sleep(random.random() * 0.01)

    with trio.fail_after(30):
        async with running(settler), trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(client, i)
        assert await read(redis, ("EXISTS", rate_window_key("key", KEY_ID, "parallel"))) == [0]
    assert most <= 5
    assert admissions > 5  # slots were released and reused


async def test_two_processes_share_an_rpm_limit(redis_url: str, redis: RespBackend) -> None:
    identity = who(Limits(rpm=100))
    clients = [RespBackend(redis_url, name=f"p{n}", command_timeout_s=5.0) for n in range(2)]
    wins = [0, 0]

    async def one(n: int, i: int) -> None:
        # Each "process" has its own client and its own local state.
        b, r = await check(clients[n], identity, facts(f"p{n}-{i}", now_ms=NOW_MS + i),
                           local=locals_[n])
        if admitted(b, r):
            wins[n] += 1

    locals_ = [LocalGovernance(), LocalGovernance()]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(150):
                for n in range(2):
                    nursery.start_soon(one, n, i)
        for client in clients:
            await client.aclose()
    assert 99 <= sum(wins) <= 101
    assert min(wins) > 0


# --------------------------------------------------------------------------- policies


async def test_fail_open_and_fail_closed_around_a_real_server(redis: RespBackend) -> None:
    faulty = FaultyBackend(redis)
    local = LocalGovernance()
    identity = who(Limits(max_budget_nanousd=1_000, rpm=3), team=Limits(max_budget_nanousd=10**6))
    settler = Settler({"counters": redis})
    with trio.fail_after(10):
        async with running(settler):
            # Redis up: two requests, the second spends the key's budget.
            for i, cost in enumerate((400, 600)):
                request = facts(f"up{i}", cost=100)
                b, r = await check(faulty, identity, request, local=local)
                assert admitted(b, r) and not b.decision.degraded
                await settle(settler, request, b, r, cost=cost, tokens=0, admitted=True)
        # Redis down, fail-open: the key is known to be over budget and is still refused.
        faulty.down = True
        b, r = await check(faulty, identity, facts("down1", cost=1), local=local)
        assert isinstance(b.decision, Rejected)
        assert (b.decision.reason, b.decision.degraded) == ("budget_exceeded", True)
        # Rate limits decided locally: the two requests admitted through Redis count there.
        assert isinstance(r.decision, Allowed) and r.decision.degraded  # third of 3 rpm
        _, r = await check(faulty, identity, facts("down2", cost=1), local=local)
        assert isinstance(r.decision, Rejected) and r.decision.degraded
        assert r.decision.status == 429
        # Fail-closed: 503 for both.
        closed = CheckSettings(budgets_policy="fail-closed", rate_limits_policy="fail-closed")
        b, r = await check(faulty, identity, facts("down3"), settings=closed, local=local)
        assert isinstance(b.decision, Rejected) and b.decision.status == 503
        assert isinstance(r.decision, Rejected) and r.decision.status == 503
        # Back up: Redis decides again (and still refuses the spent key), not degraded.
        faulty.down = False
        b, r = await check(faulty, identity, facts("up3", cost=1), local=local)
        assert isinstance(b.decision, Rejected) and not b.decision.degraded
        assert isinstance(r.decision, Allowed) and not r.decision.degraded


async def test_settlements_journaled_while_down_replay_exactly_once(
    redis: RespBackend, tmp_path: Path
) -> None:
    faulty = FaultyBackend(redis)
    identity = who(Limits(max_budget_nanousd=10**9, tpm=10_000, max_parallel=3))
    journal = Journal(tmp_path / "journal")
    settler = Settler({"counters": faulty}, journal=journal, replay_interval_s=0.05)
    with trio.fail_after(10):
        outcomes = []
        for i in range(3):
            request = facts(f"r{i}", cost=100, tokens=100)
            b, r = await check(redis, identity, request)
            assert admitted(b, r)
            outcomes.append((request, b, r))
        async with running(settler):
            faulty.down = True
            for request, b, r in outcomes:
                await settle(settler, request, b, r, cost=30, tokens=20, admitted=True)
            assert settler.statistics().journal_pending == 3
            stale = journal.pending
            faulty.down = False
            while settler.statistics().journal_pending:
                await trio.sleep(0.02)
        expected = [{"spend": 90, "reserved": 0}, {str(NOW_MS // 1000): 60}]
        state = [await hash_ints(redis, budget_keys("key", KEY_ID, 0).counters),
                 await hash_ints(redis, rate_window_key("key", KEY_ID, "tpm"))]
        assert state == expected
        # The same entries again, as a process that died before forgetting them leaves
        # them: the next process claims and replays them.
        ghost = Journal(tmp_path / "journal")
        await ghost.open()
        await ghost.append(stale)
        ghost.close()
        again = Settler({"counters": redis}, journal=Journal(tmp_path / "journal"))
        async with running(again):
            while again.statistics().replayed < 3:
                await trio.sleep(0.02)
        assert [await hash_ints(redis, budget_keys("key", KEY_ID, 0).counters),
                await hash_ints(redis, rate_window_key("key", KEY_ID, "tpm"))] == expected
