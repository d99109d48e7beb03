"""Leases against a real server: judged by Redis's clock (a caller whose clock runs ahead
cannot expire another gateway's live lease), and renewed by a request that still runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import CommandError
from triogate.governance.budgets import RESERVE
from triogate.governance.keys import PARALLEL, budget_keys, rate_window_key
from triogate.governance.leases import RENEW
from triogate.governance.rate_limits import ADMIT
from triogate.routing.keys import inflight_key
from triogate.routing.router import STATE_SCRIPT as STATE

from .support import hash_ints, one, run, zset

if TYPE_CHECKING:
    from triogate.batch import RespBackend

pytestmark = pytest.mark.integration

K = budget_keys("key", "k1", 7)
P = rate_window_key("key", "k1", PARALLEL)
LEASE = 10_000
HOUR = 3_600_000


async def server_ms(redis: RespBackend) -> int:
    seconds, micros = await one(redis, "TIME")  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


async def test_a_caller_ahead_of_redis_cannot_purge_a_live_reservation(
    redis: RespBackend,
) -> None:
    with trio.fail_after(5):
        now = await server_ms(redis)
        assert await run(redis, RESERVE, K.as_tuple(), [now, "r0", 500, 1000, LEASE, 0]) == [
            1, 0, 500]
        # A gateway whose clock runs an hour ahead: r0's lease is live by Redis's clock.
        ahead = await run(redis, RESERVE, K.as_tuple(), [now + HOUR, "r1", 600, 1000, LEASE, 0])
        holds = await hash_ints(redis, K.holds)
        leases = await zset(redis, K.leases)
    assert ahead == [0, 0, 500]  # refused: r0's 500 still counts
    assert holds == {"r0": 500}
    # And it writes leases by Redis's clock, not its own.
    assert now + LEASE <= leases["r0"] < now + LEASE + 5_000


async def test_a_caller_ahead_of_redis_cannot_take_a_live_parallel_slot(
    redis: RespBackend,
) -> None:
    with trio.fail_after(5):
        now = await server_ms(redis)
        first = await run(redis, ADMIT, [P], [now, "r0", 0, LEASE, "p", 1])
        ahead = await run(redis, ADMIT, [P], [now + HOUR, "r1", 0, LEASE, "p", 1])
        slots = await zset(redis, P)
    assert first == [1, 0, 0, 0]
    assert ahead == [0, 1, 1000, 0]
    assert set(slots) == {"r0"}
    assert slots["r0"] < now + LEASE + 5_000  # by Redis's clock, not now + HOUR


async def test_a_caller_ahead_of_redis_cannot_purge_a_least_busy_claim(
    redis: RespBackend,
) -> None:
    key = inflight_key("g", "d1")
    with trio.fail_after(5):
        now = await server_ms(redis)
        keys = ["tg:{rt:g}:usage:0", "tg:{rt:g}:cooldown", "tg:{rt:g}:latency", key]
        await run(redis, STATE, keys, [now, "claim", "r0", LEASE, 0, 0, "d1", 0, 0])
        await run(redis, STATE, keys, [now + HOUR, "claim", "r1", LEASE, 0, 0, "d1", 0, 0])
        claims = await zset(redis, key)
    assert set(claims) == {"r0", "r1"}


async def test_renewal_extends_only_the_leases_still_held(redis: RespBackend) -> None:
    with trio.fail_after(5):
        now = await server_ms(redis)
        await run(redis, RESERVE, K.as_tuple(), [now, "r0", 5, 1000, LEASE, 0])
        await run(redis, ADMIT, [P], [now, "r0", 0, LEASE, "p", 3])
        before_ttl = await one(redis, "PTTL", P)
        await trio.sleep(0.05)
        later = await server_ms(redis)
        renewed = await run(redis, RENEW, [K.leases, P, "tg:{key:k1}:other"],
                            ["r0", later, LEASE, 0, 30 * LEASE, 0])
        leases, slots = await zset(redis, K.leases), await zset(redis, P)
        after_ttl = await one(redis, "PTTL", P)
        # A request that holds nothing (purged meanwhile) gets nothing back.
        gone = await run(redis, RENEW, [K.leases, P], ["r9", now, LEASE, 0, 0])
        # A lease is never shortened (a renewal from a clock behind).
        await run(redis, RENEW, [K.leases], ["r0", now - 5_000, LEASE, 0])
        kept = await zset(redis, K.leases)
        # A renewal from a clock an hour ahead renews by Redis's clock.
        await run(redis, RENEW, [P], ["r0", now + HOUR, LEASE, 0])
        ahead = await zset(redis, P)
    assert renewed == 2
    assert gone == 0
    assert set(leases) == set(slots) == {"r0"}
    assert later > now
    assert leases["r0"] == slots["r0"] == later + LEASE
    assert kept["r0"] == later + LEASE
    assert ahead["r0"] < later + LEASE + 5_000
    assert isinstance(before_ttl, int) and isinstance(after_ttl, int)
    assert before_ttl <= LEASE + 120_000 < 29 * LEASE < after_ttl <= 30 * LEASE


@pytest.mark.parametrize("args", [
    ["r0", 1, 0, 0],          # lease_ms must be > 0
    ["r0", "x", 10, 0],       # now_ms an integer
    ["r0", 1, 10],            # one keep_ms per key
    ["r0", 1, 10, -1],        # keep_ms >= 0
])
async def test_renewal_refuses_bad_arguments(redis: RespBackend, args: list[object]) -> None:
    with trio.fail_after(5):
        reply = await run(redis, RENEW, [K.leases], args)
    assert isinstance(reply, CommandError)
    assert "lease_renew" in str(reply)
