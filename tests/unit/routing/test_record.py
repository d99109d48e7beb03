"""Router.record: one idempotent script call per group touched, on the post-call batch."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import trio

from triogate.batch import Settler, open_post_call_batch
from triogate.batch.testing import RecordingBackend
from triogate.errors import ProviderStatusError, ProviderTimeout
from triogate.routing import keys
from triogate.routing.retries import Attempt, RouteResult
from triogate.routing.router import (
    MARKER_TTL_MS,
    OWNER,
    RECORD_SCRIPT,
    Router,
    RoutingFacts,
)

from .support import NOW_MS, dep, hash_tag, make_config, state_of, text

if TYPE_CHECKING:
    from trio.testing import MockClock

    from triogate.batch import Command
    from triogate.routing.state import RoutingState

CONFIG = make_config(
    dep("a", "g"), dep("b", "g"), dep("x", "fb"),
    allowed_fails=2, cooldown_s=7.5, fallbacks={"g": ("fb",)},
)


def router() -> Router:
    return Router(CONFIG, rng=random.Random(0), clock_ms=lambda: NOW_MS + 5)


async def recorded(
    state: RoutingState, result: RouteResult[str] | None, **kwargs: object
) -> tuple[Router, tuple[Command, ...]]:
    r = router()
    settler = Settler({"counters": RecordingBackend()})
    async with open_post_call_batch(settler, trace_id=state.request_id) as post:
        r.record(post, state, result, **kwargs)  # type: ignore[arg-type]
        commands = post.commands
    return r, commands


def attempts_args(command: Command) -> list[str]:
    return [text(a) for a in command.args[8:]]


async def test_one_call_per_group_touched(autojump_clock: MockClock) -> None:
    state = state_of(CONFIG, request_id="r-7")
    attempts = [
        Attempt("a", False, ProviderTimeout("t"), 1.5),
        Attempt("b", False, ProviderStatusError(503, b""), 0.25),
        Attempt("x", True, None, 0.0425),
    ]
    state.attempts.extend(attempts)
    result = RouteResult(value="v", deployment=CONFIG.groups["fb"][0], attempts=tuple(attempts),
                         group_used="fb")
    _, commands = await recorded(state, result, usage_tokens=321, now_ms=NOW_MS)
    assert [c.script for c in commands] == [RECORD_SCRIPT, RECORD_SCRIPT]
    assert {c.owner for c in commands} == {OWNER}
    assert {c.backend for c in commands} == {"counters"}
    g, fb = commands
    for command, group in ((g, "g"), (fb, "fb")):
        assert {hash_tag(text(k)) for k in command.keys} == {f"rt:{group}"}
        assert [text(k) for k in command.keys] == [
            keys.record_markers_key(group, NOW_MS),
            keys.usage_key(group, NOW_MS),
            keys.cooldown_key(group),
            keys.latency_key(group),
        ]
        assert [text(a) for a in command.args[:8]] == [
            str(NOW_MS), "r-7", str(MARKER_TTL_MS + 60_000), "120000", "2", "7500", "0.3", "3600000"
        ]
    assert attempts_args(g) == ["a", "fail", "0", "0", "b", "fail", "0", "0"]
    assert attempts_args(fb) == ["x", "ok", "321", "42.500"]


async def test_a_run_that_raised_is_recorded_from_the_state(autojump_clock: MockClock) -> None:
    state = state_of(CONFIG)
    state.attempts.append(Attempt("b", False, ProviderTimeout("t"), 3.0))
    _, commands = await recorded(state, None)
    assert len(commands) == 1
    assert attempts_args(commands[0]) == ["b", "fail", "0", "0"]
    assert text(commands[0].args[0]) == str(NOW_MS + 5)  # the router's clock by default


async def test_non_retryable_failures_count_nothing(autojump_clock: MockClock) -> None:
    state = state_of(CONFIG)
    state.attempts.append(Attempt("a", False, ProviderStatusError(400, b"bad"), 0.1))
    state.attempts.append(Attempt("a", False, RuntimeError("bug"), 0.1))
    _, commands = await recorded(state, None)
    assert commands == ()


async def test_a_claim_is_released_even_without_attempts(autojump_clock: MockClock) -> None:
    """A request rejected by budgets after least-busy claimed a slot: release it."""
    state = state_of(CONFIG, claimed="b", request_id="r-9")
    _, commands = await recorded(state, None)
    assert len(commands) == 1
    assert [text(k) for k in commands[0].keys][4:] == [keys.inflight_key("g", "b")]
    assert attempts_args(commands[0]) == []


async def test_the_claim_rides_with_its_groups_attempts(autojump_clock: MockClock) -> None:
    state = state_of(CONFIG, claimed="a")
    attempts = (Attempt("a", False, ProviderTimeout("t"), 1.0), Attempt("x", True, None, 1.0))
    state.attempts.extend(attempts)
    result = RouteResult(value="v", deployment=CONFIG.groups["fb"][0], attempts=attempts,
                         group_used="fb")
    _, commands = await recorded(state, result, usage_tokens=10)
    g, fb = commands
    assert [text(k) for k in g.keys][4:] == [keys.inflight_key("g", "a")]
    assert len(fb.keys) == 4


async def test_facts_override_the_request_id(autojump_clock: MockClock) -> None:
    state = state_of(CONFIG, claimed="a", request_id="old")
    facts = RoutingFacts(request_id="new", now_ms=NOW_MS)
    _, commands = await recorded(state, None, facts=facts)
    assert text(commands[0].keys[0]) == keys.record_markers_key("g", NOW_MS)


async def test_record_teaches_the_mirror_the_tokens(autojump_clock: MockClock) -> None:
    state = state_of(CONFIG)
    attempts = (Attempt("a", True, None, 0.1),)
    result = RouteResult(value="v", deployment=CONFIG.groups["g"][0], attempts=attempts,
                         group_used="g")
    r, _ = await recorded(state, result, usage_tokens=900, now_ms=NOW_MS)
    view = r.mirror.overlay(state.groups[0], NOW_MS)
    assert view.deployments[0].tpm_used == 900


async def test_usage_based_avoids_what_this_process_just_used(autojump_clock: MockClock) -> None:
    config = make_config(dep("a"), dep("b"), strategy="usage-based-routing")
    r = Router(config, rng=random.Random(1), clock_ms=lambda: NOW_MS)
    settler = Settler({"counters": RecordingBackend()})
    picks = []
    for i in range(6):
        state = state_of(config, request_id=f"r{i}")

        async def call(d: object) -> str:
            await trio.lowlevel.checkpoint()
            return "v"

        result = await r.run(state, call)
        picks.append(result.deployment.id)
        async with open_post_call_batch(settler, trace_id=f"r{i}") as post:
            r.record(post, state, result, usage_tokens=100)
    assert picks.count("a") == picks.count("b") == 3
