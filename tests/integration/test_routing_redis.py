"""Routing against a real Redis-compatible server: the two scripts, then whole routers.

Part 1 drives ``routing_state.lua`` and ``routing_record.lua`` directly, table-driven
(time is ARGV ``now_ms``, so cooldown and lease expiry are tested without waiting).
Part 2 runs two :class:`Router` instances, as two gateway processes would, sharing one
Redis through batch scopes and a settler.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest
import trio

from tests.unit.routing.support import NOW_MS, dep, make_config
from triogate.batch import (
    BackendUnavailable,
    MemoryTracer,
    Settler,
    open_batch_scope,
    open_post_call_batch,
)
from triogate.batch.testing import FaultyBackend
from triogate.errors import ProviderTimeout
from triogate.routing import keys
from triogate.routing.retries import Attempt
from triogate.routing.router import (
    RECORD_SCRIPT,
    STATE_SCRIPT,
    Router,
    RoutingFacts,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from triogate.batch import Backend, RespBackend, Script
    from triogate.config import Deployment, GatewayConfig
    from triogate.routing.retries import RouteResult
    from triogate.routing.state import RoutingState

pytestmark = pytest.mark.integration

G = "grp"
M = NOW_MS  # 10 s into an epoch minute
#: (id, rpm limit, tpm limit); 0 = no limit.
DEPS = (("a", 0, 0), ("b", 10, 0), ("c", 0, 1000))
Row = tuple[int, int, int, int, int, bytes]
Arg = bytes | str | int | float  # what a wire command carries


async def run_script(redis: RespBackend, script: Script, keys_: Sequence[str],
                     args: Sequence[Arg]) -> object:
    [reply] = await redis.execute([("EVAL", script.source, len(keys_), *keys_, *args)])
    if isinstance(reply, Exception):
        raise reply
    return reply


async def read_state(
    redis: RespBackend, *, now_ms: int = M, mode: str = "read", request_id: str = "req",
    lease_ms: int = 30_000, estimate_tokens: int = 0, offset: int = 0,
) -> tuple[str | None, dict[str, Row]]:
    reply = await run_script(
        redis, STATE_SCRIPT,
        [keys.usage_key(G, now_ms), keys.cooldown_key(G), keys.latency_key(G),
         *[keys.inflight_key(G, d) for d, _, _ in DEPS]],
        [now_ms, mode, request_id, lease_ms, estimate_tokens, offset,
         *[v for d in DEPS for v in d]],
    )
    assert isinstance(reply, list)
    rows = {d: tuple(reply[1 + 6 * i : 7 + 6 * i]) for i, (d, _, _) in enumerate(DEPS)}
    claimed = DEPS[reply[0] - 1][0] if reply[0] else None
    return claimed, rows


async def record(
    redis: RespBackend, attempts: Sequence[tuple[str, str, int, str]], *, now_ms: int = M,
    request_id: str = "req", release: Sequence[str] = (), allowed_fails: int = 2,
    cooldown_ms: int = 5000,
) -> object:
    return await run_script(
        redis, RECORD_SCRIPT,
        [keys.record_markers_key(G, now_ms), keys.usage_key(G, now_ms),
         keys.cooldown_key(G), keys.latency_key(G),
         *[keys.inflight_key(G, d) for d in release]],
        [now_ms, request_id, 600_000, 120_000, allowed_fails, cooldown_ms, "0.3", 3_600_000,
         *[v for a in attempts for v in a]],
    )


EMPTY: Row = (0, 0, 0, 0, 0, b"")

# --------------------------------------------------------------------- routing_state.lua

READ_CASES = [
    ("nothing recorded", [], {}),
    (
        "usage of the current minute",
        [("HSET", keys.usage_key(G, M), "rpm:a", 3, "tpm:a", 120, "fail:b", 2)],
        {"a": (3, 120, 0, 0, 0, b""), "b": (0, 0, 2, 0, 0, b"")},
    ),
    ("last minute's usage is not this minute's",
     [("HSET", keys.usage_key(G, M - 60_000), "rpm:a", 9)], {}),
    ("a live cooldown", [("HSET", keys.cooldown_key(G), "a", M + 1)],
     {"a": (0, 0, 0, M + 1, 0, b"")}),
    ("an expired cooldown reads as none", [("HSET", keys.cooldown_key(G), "a", M)], {}),
    ("latency", [("HSET", keys.latency_key(G), "c", "12.500")],
     {"c": (0, 0, 0, 0, 0, b"12.500")}),
    (
        "in flight counts live leases only",
        [("ZADD", keys.inflight_key(G, "b"), M + 1, "r1", M, "r2", M - 5, "r3")],
        {"b": (0, 0, 0, 0, 1, b"")},
    ),
    # routing_state reads the in-flight sets only when one exists (EXISTS first): a set
    # that exists with nothing live must still count 0, and the others 0 unread.
    ("in flight: a set of expired leases counts 0",
     [("ZADD", keys.inflight_key(G, "c"), M, "r1", M - 5, "r2")], {}),
]


@pytest.mark.parametrize(("name", "setup", "expected"), READ_CASES, ids=[c[0] for c in READ_CASES])
async def test_state_read(
    redis: RespBackend, name: str, setup: list[tuple[Arg, ...]], expected: dict[str, Row]
) -> None:
    with trio.fail_after(5):
        if setup:
            await redis.execute(setup)
        [before] = await redis.execute([("DBSIZE",)])
        claimed, rows = await read_state(redis)
        [after] = await redis.execute([("DBSIZE",)])
    assert claimed is None
    assert rows == {d: expected.get(d, EMPTY) for d, _, _ in DEPS}
    assert before == after  # read mode writes nothing


async def test_read_mode_leaves_expired_leases_alone(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await redis.execute([("ZADD", keys.inflight_key(G, "a"), M - 1, "dead")])
        await read_state(redis)
        assert await redis.execute([("ZCARD", keys.inflight_key(G, "a"))]) == [1]


CLAIM_CASES = [
    # name, setup, estimate_tokens, offset, claimed
    (
        "fewest in flight",
        [("ZADD", keys.inflight_key(G, "a"), M + 9, "x", M + 9, "y"),
         ("ZADD", keys.inflight_key(G, "b"), M + 9, "z")],
        0, 0, "c",
    ),
    (
        "a cooling deployment is skipped",
        [("ZADD", keys.inflight_key(G, "a"), M + 9, "x", M + 9, "y"),
         ("ZADD", keys.inflight_key(G, "b"), M + 9, "z"),
         ("HSET", keys.cooldown_key(G), "c", M + 1)],
        0, 0, "b",
    ),
    (
        "a deployment at its rpm is skipped",
        [("HSET", keys.usage_key(G, M), "rpm:b", 10),
         ("ZADD", keys.inflight_key(G, "a"), M + 9, "x"),
         ("ZADD", keys.inflight_key(G, "c"), M + 9, "y", M + 9, "z")],
        0, 0, "a",
    ),
    ("tpm limit counts the estimate",
     [("HSET", keys.usage_key(G, M), "tpm:c", 900, "rpm:b", 10),
      ("ZADD", keys.inflight_key(G, "a"), M + 9, "x")], 101, 2, "a"),
    ("tpm limit with room for the estimate",
     [("HSET", keys.usage_key(G, M), "tpm:c", 900, "rpm:b", 10),
      ("ZADD", keys.inflight_key(G, "a"), M + 9, "x")], 100, 0, "c"),
    ("a tie goes to the offset (0)", [], 0, 0, "a"),
    ("a tie goes to the offset (1)", [], 0, 1, "b"),
    ("a tie goes to the offset (2)", [], 0, 2, "c"),
    (
        "expired leases free their slots",
        [("ZADD", keys.inflight_key(G, "a"), M - 1, "dead1", M, "dead2"),
         ("ZADD", keys.inflight_key(G, "b"), M + 9, "x"),
         ("ZADD", keys.inflight_key(G, "c"), M + 9, "y")],
        0, 1, "a",
    ),
    (
        "nothing eligible claims nothing",
        [("HSET", keys.cooldown_key(G), "a", M + 5, "b", M + 5, "c", M + 5)],
        0, 0, None,
    ),
]


@pytest.mark.parametrize(
    ("name", "setup", "estimate", "offset", "expected"), CLAIM_CASES,
    ids=[c[0] for c in CLAIM_CASES],
)
async def test_least_busy_claim(
    redis: RespBackend, name: str, setup: list[tuple[Arg, ...]], estimate: int,
    offset: int, expected: str | None,
) -> None:
    with trio.fail_after(5):
        if setup:
            await redis.execute(setup)
        [live_before] = await redis.execute(
            [("ZCOUNT", keys.inflight_key(G, expected or "a"), f"({M}", "+inf")]
        )
        claimed, rows = await read_state(
            redis, mode="claim", request_id="me", estimate_tokens=estimate, offset=offset
        )
        assert claimed == expected
        members = await redis.execute(
            [("ZRANGE", keys.inflight_key(G, d), 0, -1) for d, _, _ in DEPS]
        )
    for (d, _, _), held in zip(DEPS, members, strict=True):
        assert isinstance(held, list)
        assert (b"me" in held) == (d == expected)
        assert not any(m.startswith(b"dead") for m in held)
    if expected is not None:
        assert rows[expected][4] == live_before + 1  # type: ignore[operator]


async def test_a_claims_lease_expires(redis: RespBackend) -> None:
    with trio.fail_after(5):
        claimed, rows = await read_state(redis, mode="claim", request_id="r1", lease_ms=30_000)
        assert claimed == "a"
        assert rows["a"][4] == 1
        [pttl] = await redis.execute([("PTTL", keys.inflight_key(G, "a"))])
        assert 0 < pttl <= 30_000  # type: ignore[operator]
        _, rows = await read_state(redis, now_ms=M + 29_999)
        assert rows["a"][4] == 1
        _, rows = await read_state(redis, now_ms=M + 30_000)
        assert rows["a"][4] == 0  # the process that claimed it died: the lease ran out
        claimed, rows = await read_state(redis, now_ms=M + 30_000, mode="claim",
                                         request_id="r2")
        assert (claimed, rows["a"][4]) == ("a", 1)
        assert await redis.execute([("ZRANGE", keys.inflight_key(G, "a"), 0, -1)]) == [[b"r2"]]


async def test_claiming_twice_with_one_request_id_counts_once(redis: RespBackend) -> None:
    with trio.fail_after(5):
        first, _ = await read_state(redis, mode="claim", request_id="same")
        again, rows = await read_state(redis, mode="claim", request_id="same", offset=2)
    assert first == again == "a"
    assert sum(r[4] for r in rows.values()) == 1


# --------------------------------------------------------------------- routing_record.lua


async def test_record_success_counts_usage_and_latency(redis: RespBackend) -> None:
    with trio.fail_after(5):
        assert await record(redis, [("a", "ok", 150, "100.000")], request_id="r1") == [1]
        _, rows = await read_state(redis)
        assert rows["a"] == (1, 150, 0, 0, 0, b"100.000")
        await record(redis, [("a", "ok", 50, "200")], request_id="r2")
        _, rows = await read_state(redis)
        assert rows["a"] == (2, 200, 0, 0, 0, b"130.000")  # 0.3·200 + 0.7·100
        [usage_ttl, latency_ttl, marker_ttl] = await redis.execute([
            ("PTTL", keys.usage_key(G, M)), ("PTTL", keys.latency_key(G)),
            ("PTTL", keys.record_markers_key(G, M)),
        ])
    assert 119_000 < usage_ttl <= 120_000  # type: ignore[operator]
    assert 3_599_000 < latency_ttl <= 3_600_000  # type: ignore[operator]
    assert 599_000 < marker_ttl <= 600_000  # type: ignore[operator]


async def test_record_markers_are_fields_of_one_hash_per_minute(redis: RespBackend) -> None:
    """Markers: one HASH per group and minute (a PAD field keeps it a hashtable), its TTL
    armed once; usage and latency TTLs armed when the key may have been created, not by
    every record (a later record does not move them)."""
    with trio.fail_after(5):
        for i in range(3):
            assert await record(redis, [("a", "ok", 10, "5")], request_id=f"r{i}") == [1]
            if i == 0:
                await redis.execute([("PEXPIRE", keys.record_markers_key(G, M), 500_000),
                                     ("PEXPIRE", keys.usage_key(G, M), 100_000),
                                     ("PEXPIRE", keys.latency_key(G), 3_000_000)])
        fields, encoding, marker_ttl, usage_ttl, latency_ttl = await redis.execute([
            ("HKEYS", keys.record_markers_key(G, M)),
            ("OBJECT", "ENCODING", keys.record_markers_key(G, M)),
            ("PTTL", keys.record_markers_key(G, M)), ("PTTL", keys.usage_key(G, M)),
            ("PTTL", keys.latency_key(G)),
        ])
        # The next minute's first success re-arms the latency TTL (lives ~1 h after its
        # last update, to within a minute) and its usage hash gets its own.
        await record(redis, [("a", "ok", 10, "5")], request_id="r9", now_ms=M + 60_000)
        latency_later, usage_next = await redis.execute([
            ("PTTL", keys.latency_key(G)), ("PTTL", keys.usage_key(G, M + 60_000))])
    assert isinstance(fields, list) and sorted(fields) == [b"r0", b"r1", b"r2", b"~"]
    assert encoding == b"hashtable"
    assert 499_000 < marker_ttl <= 500_000  # type: ignore[operator]
    assert 99_000 < usage_ttl <= 100_000  # type: ignore[operator]
    assert 2_999_000 < latency_ttl <= 3_000_000  # type: ignore[operator]
    assert 3_599_000 < latency_later <= 3_600_000  # type: ignore[operator]
    assert 119_000 < usage_next <= 120_000  # type: ignore[operator]


async def test_a_new_field_arms_the_latency_ttl(redis: RespBackend) -> None:
    """A latency HASH created while the minute's usage already counts the deployment (the
    hash expired or was evicted) still gets a TTL: nothing lives forever."""
    with trio.fail_after(5):
        await record(redis, [("a", "ok", 10, "5")], request_id="r1")
        await redis.execute([("DEL", keys.latency_key(G))])
        await record(redis, [("a", "ok", 10, "5")], request_id="r2")
        [ttl] = await redis.execute([("PTTL", keys.latency_key(G))])
    assert 3_599_000 < ttl <= 3_600_000  # type: ignore[operator]


async def test_old_layout_markers_do_not_clash(redis: RespBackend) -> None:
    """An older version's marker (a STRING per request, ``rec:<request id>``) has another
    name: a record of the new layout neither misreads nor overwrites it."""
    old = f"tg:{keys.group_tag(G)}:rec:r1"
    with trio.fail_after(5):
        await redis.execute([("SET", old, "1", "PX", 600_000)])
        assert await record(redis, [("a", "ok", 10, "5")], request_id="r1") == [1]
        assert await record(redis, [("a", "ok", 10, "5")], request_id="r1") == [0]
        value, kind = await redis.execute([("GET", old), ("TYPE", keys.record_markers_key(G, M))])
    assert value == b"1" and kind == b"hash"


async def test_cooldown_after_allowed_fails_and_its_expiry(redis: RespBackend) -> None:
    with trio.fail_after(5):
        assert await record(redis, [("b", "fail", 0, "0")], request_id="r1") == [1]
        _, rows = await read_state(redis)
        assert rows["b"] == (0, 0, 1, 0, 0, b"")  # one failure of two allowed
        reply = await record(redis, [("b", "fail", 0, "0")], request_id="r2", now_ms=M + 1000)
        assert reply == [1, b"b"]
        until = M + 1000 + 5000
        _, rows = await read_state(redis, now_ms=M + 1000)
        assert rows["b"] == (0, 0, 2, until, 0, b"")
        _, rows = await read_state(redis, now_ms=until - 1)
        assert rows["b"][3] == until
        _, rows = await read_state(redis, now_ms=until)
        assert rows["b"][3] == 0  # cooled down
        [cooldown_ttl] = await redis.execute([("PTTL", keys.cooldown_key(G))])
        assert 5000 < cooldown_ttl <= 65_000  # type: ignore[operator]


async def test_failures_count_per_minute(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await record(redis, [("b", "fail", 0, "0")], request_id="r1", now_ms=M)
        # 50 s later it is the next minute: a fresh count, no cooldown.
        assert await record(redis, [("b", "fail", 0, "0")], request_id="r2",
                            now_ms=M + 50_000) == [1]
        _, rows = await read_state(redis, now_ms=M + 50_000)
    assert rows["b"][2:4] == (1, 0)


async def test_no_cooldown_when_cooldown_is_zero(redis: RespBackend) -> None:
    with trio.fail_after(5):
        for i in range(4):
            assert await record(redis, [("a", "fail", 0, "0")], request_id=f"r{i}",
                                cooldown_ms=0) == [1]
        _, rows = await read_state(redis)
    assert rows["a"][2:4] == (4, 0)


async def test_a_later_failure_does_not_shorten_a_cooldown(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await record(redis, [("a", "fail", 0, "0")], request_id="r1", allowed_fails=1,
                     cooldown_ms=60_000)
        await record(redis, [("a", "fail", 0, "0")], request_id="r2", allowed_fails=1,
                     cooldown_ms=1_000)
        _, rows = await read_state(redis)
    assert rows["a"][3] == M + 60_000


async def test_record_is_idempotent_by_request_id(redis: RespBackend) -> None:
    attempts = [("a", "fail", 0, "0"), ("a", "fail", 0, "0"), ("c", "ok", 70, "20")]
    with trio.fail_after(5):
        await read_state(redis, mode="claim", request_id="r1")  # claims "a"
        first = await record(redis, attempts, request_id="r1", release=["a"])
        _, once = await read_state(redis)
        [dump_once] = await redis.execute([("HGETALL", keys.usage_key(G, M))])
        for _ in range(2):
            assert await record(redis, attempts, request_id="r1", release=["a"]) == [0]
        _, thrice = await read_state(redis)
        [dump_thrice] = await redis.execute([("HGETALL", keys.usage_key(G, M))])
    assert first == [1, b"a"]
    assert once == thrice
    assert dump_once == dump_thrice
    assert once["a"] == (0, 0, 2, M + 5000, 0, b"")  # released
    assert once["c"] == (1, 70, 0, 0, 0, b"20.000")


async def test_a_replay_still_releases_the_claim(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await record(redis, [], request_id="r1", release=["b"])
        await redis.execute([("ZADD", keys.inflight_key(G, "b"), M + 9, "r1")])
        assert await record(redis, [], request_id="r1", release=["b"]) == [0]
        assert await redis.execute([("ZCARD", keys.inflight_key(G, "b"))]) == [0]


# --------------------------------------------------------------------- two routers


class Clock:
    """The app's epoch clock, moved by hand (no MockClock: real I/O here)."""

    def __init__(self) -> None:
        self.now_ms = NOW_MS

    def __call__(self) -> int:
        return self.now_ms


async def route_read(router: Router, backend: Backend, group: str, request_id: str,
                     now_ms: int, estimate_tokens: int = 0,
                     tracer: MemoryTracer | None = None) -> RoutingState:
    facts = RoutingFacts(request_id=request_id, now_ms=now_ms, estimate_tokens=estimate_tokens)
    async with open_batch_scope({"counters": backend}, tracer=tracer,
                                trace_id=request_id) as scope:
        route = scope.start_participant(router.read, scope.batch, group, facts, name="routing")
    return route.result()


async def route_record(router: Router, settler: Settler, state: RoutingState,
                       result: RouteResult[str] | None, *, usage_tokens: int = 0,
                       now_ms: int) -> None:
    async with open_post_call_batch(settler, trace_id=state.request_id) as post:
        router.record(post, state, result, usage_tokens=usage_tokens, now_ms=now_ms)
    await post.wait_settled()
    for command_handle in post.commands:
        assert command_handle.owner == "routing"


async def ok(deployment: Deployment) -> str:
    await trio.lowlevel.checkpoint()
    return deployment.id


class Gateways:
    """Two routers ("processes") on one Redis, and a settler for their post-call writes."""

    def __init__(self, config: GatewayConfig, backend: Backend, settler: Settler) -> None:
        self.clock = Clock()
        self.backend = backend
        self.settler = settler
        self.one = Router(config, rng=random.Random(1), clock_ms=self.clock)
        self.two = Router(config, rng=random.Random(2), clock_ms=self.clock)


async def open_settler(nursery: trio.Nursery, backend: Backend) -> Settler:
    settler = Settler({"counters": backend})
    await nursery.start(settler.run)
    return settler


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as n:
        yield n
        n.cancel_scope.cancel()


async def test_one_wait_for_a_group_and_its_fallbacks(redis: RespBackend) -> None:
    config = make_config(dep("a"), dep("x", "fb1"), dep("y", "fb2"),
                         fallbacks={"g": ("fb1", "fb2")})
    tracer = MemoryTracer()
    router = Router(config, clock_ms=Clock())
    with trio.fail_after(5):
        await route_read(router, redis, "g", "warm-up", M)  # loads the script (NOSCRIPT once)
        state = await route_read(router, redis, "g", "r1", M, tracer=tracer)
    summary = tracer.summary("r1")
    assert summary.waits_before == 1
    assert summary.records[0].commands == ("EVALSHA routing_state",) * 3
    assert not state.degraded


async def test_a_cooldown_recorded_by_one_process_is_seen_by_the_other(
    redis: RespBackend, nursery: trio.Nursery
) -> None:
    config = make_config(dep("a"), dep("b"), allowed_fails=1, cooldown_s=30, num_retries=1)
    with trio.fail_after(10):
        gw = Gateways(config, redis, await open_settler(nursery, redis))
        now = gw.clock.now_ms
        state = await route_read(gw.one, redis, "g", "r1", now)

        async def first_call_fails(d: Deployment) -> str:
            if not state.attempts:
                raise ProviderTimeout("slow")
            return d.id

        result = await gw.one.run(state, first_call_fails)
        failed = state.attempts[0].deployment_id
        healthy = result.deployment.id
        assert failed != healthy
        await route_record(gw.one, gw.settler, state, result, usage_tokens=10, now_ms=now)

        # The other process has never seen a failure; its next read has the cooldown.
        seen = await route_read(gw.two, redis, "g", "r2", now)
        assert seen.group_state("g").get(failed).cooldown_until_ms == now + 30_000  # type: ignore[union-attr]
        called = []
        for i in range(15):
            s = await route_read(gw.two, redis, "g", f"t{i}", now)
            r = await gw.two.run(s, ok)
            called.append(r.deployment.id)
            await route_record(gw.two, gw.settler, s, r, usage_tokens=1, now_ms=now)
        assert set(called) == {healthy}

        gw.clock.now_ms = now + 30_000  # the cooldown is over for everyone
        called = []
        for i in range(30):
            s = await route_read(gw.two, redis, "g", f"u{i}", gw.clock.now_ms)
            called.append((await gw.two.run(s, ok)).deployment.id)
        assert failed in called


async def test_usage_based_routing_spreads_load_by_shared_usage(
    redis: RespBackend, nursery: trio.Nursery
) -> None:
    config = make_config(dep("a"), dep("b"), dep("c"), strategy="usage-based-routing")
    tokens = random.Random(42)
    with trio.fail_after(20):
        gw = Gateways(config, redis, await open_settler(nursery, redis))
        now = gw.clock.now_ms
        picks = []
        for i in range(24):
            router = gw.one if i % 2 else gw.two
            used = await redis.execute(
                [("HGET", keys.usage_key("g", now), f"tpm:{d}") for d in "abc"]
            )
            tpm = {d: int(v or 0) for d, v in zip("abc", used, strict=True)}  # type: ignore[call-overload]
            lowest = {d for d in "abc" if tpm[d] == min(tpm.values())}
            state = await route_read(router, redis, "g", f"r{i}", now)
            result = await router.run(state, ok)
            assert result.deployment.id in lowest, (i, tpm, result.deployment.id)
            picks.append(result.deployment.id)
            await route_record(router, gw.settler, state, result,
                               usage_tokens=tokens.randrange(50, 500), now_ms=now)
    assert set(picks) == {"a", "b", "c"}


async def test_least_busy_claims_are_shared(redis: RespBackend, nursery: trio.Nursery) -> None:
    config = make_config(dep("a"), dep("b"), strategy="least-busy")
    with trio.fail_after(10):
        gw = Gateways(config, redis, await open_settler(nursery, redis))
        now = gw.clock.now_ms
        first = await route_read(gw.one, redis, "g", "r1", now)
        second = await route_read(gw.two, redis, "g", "r2", now)
        assert first.claimed is not None and second.claimed is not None
        assert first.claimed != second.claimed  # the other process's claim counted
        assert [s.in_flight for s in second.group_state("g").deployments] == [1, 1]

        # The second request runs on its claim; the first is rejected (say, by budgets).
        result = await gw.two.run(second, ok)
        assert result.deployment.id == second.claimed
        await route_record(gw.two, gw.settler, second, result, usage_tokens=5, now_ms=now)
        await route_record(gw.one, gw.settler, first, None, now_ms=now)
        counts = await redis.execute(
            [("ZCARD", keys.inflight_key("g", d)) for d in ("a", "b")]
        )
        assert counts == [0, 0]

        # A claim held by one process steers the other's next claim.
        held = await route_read(gw.one, redis, "g", "r3", now)
        for i in range(5):
            other = await route_read(gw.two, redis, "g", f"r4-{i}", now)
            assert other.claimed != held.claimed
            await route_record(gw.two, gw.settler, other, None, now_ms=now)


async def test_degraded_mode_fails_open_on_what_this_process_saw(
    redis: RespBackend, nursery: trio.Nursery
) -> None:
    config = make_config(dep("a"), dep("b"), allowed_fails=1, cooldown_s=60)
    faulty = FaultyBackend(redis)
    with trio.fail_after(10):
        settler = await open_settler(nursery, redis)
        clock = Clock()
        writer = Router(config, rng=random.Random(1), clock_ms=clock)
        reader = Router(config, rng=random.Random(2), clock_ms=clock)
        state = await route_read(writer, redis, "g", "r1", clock.now_ms)
        state.attempts.append(Attempt("a", False, ProviderTimeout("t"), 1.0))
        await route_record(writer, settler, state, None, now_ms=clock.now_ms)
        # The reader learns of the cooldown by reading Redis, then Redis goes away.
        learned = await route_read(reader, faulty, "g", "r2", clock.now_ms)
        assert not learned.degraded
        faulty.down = True
        blind = await route_read(reader, faulty, "g", "r3", clock.now_ms + 1000)
        assert blind.degraded
        assert blind.group_state("g").get("a").cooldown_until_ms == clock.now_ms + 60_000  # type: ignore[union-attr]
        called = {(await reader.run(blind, ok)).deployment.id for _ in range(10)}
        assert called == {"b"}
        with pytest.raises(BackendUnavailable):
            await faulty.execute([("PING",)])


async def test_a_dashboard_snapshot_reads_without_claiming(
    redis: RespBackend, nursery: trio.Nursery
) -> None:
    """``Router.snapshot`` (the dashboard's deployments page) sees claims and cooldowns,
    and leaves no claim of its own, even under least-busy."""
    config = make_config(dep("a"), dep("b"), strategy="least-busy")
    with trio.fail_after(10):
        gw = Gateways(config, redis, await open_settler(nursery, redis))
        now = gw.clock.now_ms
        held = await route_read(gw.one, redis, "g", "r1", now)
        for _ in range(3):
            async with open_batch_scope({"counters": redis}) as scope:
                part = scope.start_participant(
                    lambda: gw.two.snapshot(scope.batch, ["g"], now_ms=now), name="ui")
            [group] = part.result()
            assert not group.degraded
            in_flight = {s.id: s.in_flight for s in group.deployments}
            assert in_flight == {held.claimed: 1, ({"a", "b"} - {held.claimed}).pop(): 0}
        faulty = FaultyBackend(redis)
        faulty.down = True
        async with open_batch_scope({"counters": faulty}) as scope:
            part = scope.start_participant(
                lambda: gw.two.snapshot(scope.batch, ["g"], now_ms=now), name="ui")
        assert part.result()[0].degraded
