"""Router.read: one script call per group in the shared round; degraded mode."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from triogate.batch import BackendUnavailable, Batch, CommandError, open_batch_scope
from triogate.batch.testing import FaultyBackend, RecordingBackend
from triogate.routing.router import (
    OWNER,
    STATE_SCRIPT,
    Router,
    RoutingFacts,
    RoutingState,
    UnknownGroup,
)

from .support import NOW_MS, dep, fake_state, hash_tag, make_config, script_args, script_keys, text

if TYPE_CHECKING:
    from trio.testing import MockClock

    from triogate.batch import Backend
    from triogate.config import GatewayConfig

FACTS = RoutingFacts(request_id="req-1", now_ms=NOW_MS, estimate_tokens=250)


def three_groups(strategy: str = "simple-shuffle") -> GatewayConfig:
    return make_config(
        dep("a1", "g", rpm=100, tpm=5000), dep("a2", "g"),
        dep("b1", "fb1"),
        dep("c1", "fb2"), dep("c2", "fb2"), dep("c3", "fb2"),
        dep("z1", "unrelated"),
        strategy=strategy,
        fallbacks={"g": ("fb1", "fb2")},
    )


async def read_with_others(router: Router, backend: Backend, group: str = "g") -> RoutingState:
    """Run routing's read next to two other participants of one batch scope."""

    async def other(batch: Batch, owner: str) -> object:
        try:
            return await batch.call("GET", keys=[f"k:{owner}"], backend="counters", owner=owner)
        except BackendUnavailable:  # their own fail-open policy; not routing's concern
            return None

    async with open_batch_scope({"counters": backend}) as scope:
        others = [
            scope.start_participant(other, scope.batch, owner, name=owner)
            for owner in ("auth", "budgets")
        ]
        route = scope.start_participant(router.read, scope.batch, group, FACTS, name="routing")
    assert scope.statistics().rounds == 1
    for participant in others:
        participant.result()  # raises if the neighbour failed
    return route.result()


async def test_read_declares_one_script_per_group_in_one_round(autojump_clock: MockClock) -> None:
    backend = RecordingBackend(respond=fake_state())
    router = Router(three_groups(), rng=random.Random(1), clock_ms=lambda: NOW_MS)
    state = await read_with_others(router, backend)

    assert len(backend.pipelines) == 1
    scripts = [w for w in backend.pipelines[0] if text(w[0]) == "EVALSHA"]
    assert [text(w[1]) for w in scripts] == [STATE_SCRIPT.sha] * 3
    assert len(backend.pipelines[0]) == 5  # plus auth's and budgets' GETs
    groups_read = []
    for wire in scripts:
        keys, args = script_keys(wire), script_args(wire)
        tags = {hash_tag(k) for k in keys}
        assert len(tags) == 1, keys
        groups_read.append(tags.pop())
        assert args[0] == str(NOW_MS)
        assert args[1] == "read"  # no claim, no write, outside least-busy
        assert args[2] == "req-1"
        assert args[4] == "250"
    assert groups_read == ["rt:g", "rt:fb1", "rt:fb2"]
    # KEYS: usage, cooldown, latency, then one in-flight set per deployment.
    assert [len(script_keys(w)) for w in scripts] == [5, 4, 6]
    assert script_args(scripts[0])[6:] == ["a1", "100", "5000", "a2", "0", "0"]

    assert [g.group for g in state.groups] == ["g", "fb1", "fb2"]
    assert not state.degraded
    assert state.claimed is None


async def test_read_decodes_usage_cooldown_latency_and_in_flight(
    autojump_clock: MockClock,
) -> None:
    rows = {
        "a1": (7, 900, 2, NOW_MS + 4000, 3, "12.500"),
        "a2": (1, 50, 0, 0, 0, ""),
    }
    backend = RecordingBackend(respond=fake_state(rows))
    router = Router(three_groups(), rng=random.Random(1), clock_ms=lambda: NOW_MS)
    state = await read_with_others(router, backend)
    a1, a2 = state.group_state("g").deployments
    assert (a1.rpm_used, a1.tpm_used, a1.fails, a1.cooldown_until_ms, a1.in_flight) == (
        7, 900, 2, NOW_MS + 4000, 3
    )
    assert a1.latency_ms == 12.5
    assert a2.latency_ms is None
    assert (state.request_id, state.estimate_tokens, state.now_ms) == ("req-1", 250, NOW_MS)
    # a1 cools down: every pick is a2.
    assert {router.pick(state).id for _ in range(20)} == {"a2"}  # type: ignore[union-attr]


async def test_least_busy_claims_in_the_requested_group_only(autojump_clock: MockClock) -> None:
    backend = RecordingBackend(respond=fake_state(claim="a2"))
    router = Router(three_groups("least-busy"), rng=random.Random(3), clock_ms=lambda: NOW_MS)
    state = await read_with_others(router, backend)
    scripts = [w for w in backend.pipelines[0] if text(w[0]) == "EVALSHA"]
    modes = [script_args(w)[1] for w in scripts]
    assert modes == ["claim", "read", "read"]
    assert script_args(scripts[0])[5] in {"0", "1"}  # the random tie-break offset
    assert state.claimed == "a2"


async def test_unknown_group_is_an_error(autojump_clock: MockClock) -> None:
    router = Router(three_groups(), clock_ms=lambda: NOW_MS)
    async with open_batch_scope({"counters": RecordingBackend()}) as scope:
        with pytest.raises(UnknownGroup):
            await router.read(scope.batch, "nope", FACTS)


async def test_backend_down_fails_open_from_the_local_mirror(autojump_clock: MockClock) -> None:
    faulty = FaultyBackend(RecordingBackend(respond=fake_state()))
    faulty.down = True
    config = make_config(dep("a"), dep("b"), allowed_fails=1, cooldown_s=30)
    router = Router(config, rng=random.Random(2), clock_ms=lambda: NOW_MS)
    # This process saw "a" fail a moment ago; Redis is unreachable now.
    assert router.mirror.note_failure("a", now_ms=NOW_MS - 1000, allowed_fails=1, cooldown_s=30)
    router.mirror.note_success("b", now_ms=NOW_MS - 500, latency_ms=40.0)

    state = await read_with_others(router, faulty)
    assert state.degraded
    g = state.group_state("g")
    assert g.degraded
    a, b = g.deployments
    assert a.cooldown_until_ms == NOW_MS + 29_000
    assert a.fails == 1
    assert (b.rpm_used, b.latency_ms) == (1, 40.0)
    assert {router.pick(state).id for _ in range(20)} == {"b"}  # type: ignore[union-attr]
    assert router.decide(state).degraded


async def test_an_error_reply_degrades_only_that_group(autojump_clock: MockClock) -> None:
    good = fake_state({"b1": (4, 0, 0, 0, 0, "")})

    def respond(wire: tuple[object, ...]) -> object:
        if text(wire[0]) == "EVALSHA" and "rt:g}" in script_keys(wire)[0]:
            return CommandError("ERR something broke")
        return good(wire)

    router = Router(three_groups(), rng=random.Random(1), clock_ms=lambda: NOW_MS)
    state = await read_with_others(router, RecordingBackend(respond=respond))
    assert [g.degraded for g in state.groups] == [True, False, False]
    assert state.group_state("fb1").deployments[0].rpm_used == 4


async def test_a_malformed_reply_degrades_instead_of_crashing(autojump_clock: MockClock) -> None:
    router = Router(three_groups(), rng=random.Random(1), clock_ms=lambda: NOW_MS)
    state = await read_with_others(router, RecordingBackend(respond=lambda w: [0, 1, 2]))
    assert all(g.degraded for g in state.groups)


async def test_reads_teach_the_mirror(autojump_clock: MockClock) -> None:
    rows = {"a1": (3, 300, 1, NOW_MS + 9000, 0, "80.0")}
    router = Router(three_groups(), rng=random.Random(1), clock_ms=lambda: NOW_MS)
    await read_with_others(router, RecordingBackend(respond=fake_state(rows)))
    faulty = FaultyBackend(RecordingBackend())
    faulty.down = True
    state = await read_with_others(router, faulty)
    a1 = state.group_state("g").deployments[0]
    assert (a1.rpm_used, a1.tpm_used, a1.fails, a1.cooldown_until_ms, a1.latency_ms) == (
        3, 300, 1, NOW_MS + 9000, 80.0
    )


def test_owner_is_routing() -> None:
    assert OWNER == "routing"
