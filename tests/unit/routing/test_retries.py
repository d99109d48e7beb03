"""Router.run: retries, backoff on Trio's clock, fallbacks, cooldowns, the local mirror."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import attrs
import pytest
import trio
import trio.testing

from triogate.errors import (
    ProviderConnectError,
    ProviderError,
    ProviderStatusError,
    ProviderTimeout,
)
from triogate.routing.retries import MAX_BACKOFF_S, RetryPolicy, backoff_s, is_retryable
from triogate.routing.router import NoDeploymentAvailable, Router

from .support import NOW_MS, dep, make_config, state_of

if TYPE_CHECKING:
    from collections.abc import Iterable

    from trio.testing import MockClock

    from triogate.config import Deployment, GatewayConfig
    from triogate.routing.state import RoutingState


def epoch_ms() -> int:
    """The app's epoch clock, driven by Trio's (Mock)clock."""
    return NOW_MS + round(trio.current_time() * 1000)


class Upstream:
    """A fake model call: per deployment id, a queue of outcomes (an exception or a value).

    When a queue is empty the call returns ``"ok:<id>"``. Every call is logged with the
    Trio time it started.
    """

    def __init__(self, script: dict[str, Iterable[object]] | None = None,
                 *, latency_s: float = 0.0) -> None:
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.latency_s = latency_s
        self.calls: list[tuple[float, str]] = []

    async def __call__(self, deployment: Deployment) -> str:
        self.calls.append((trio.current_time(), deployment.id))
        if self.latency_s:
            await trio.sleep(self.latency_s)
        queue = self.script.get(deployment.id, [])
        outcome = queue.pop(0) if queue else f"ok:{deployment.id}"
        if isinstance(outcome, BaseException):
            raise outcome
        return str(outcome)

    @property
    def ids(self) -> list[str]:
        return [i for _, i in self.calls]

    @property
    def times(self) -> list[float]:
        return [t for t, _ in self.calls]


def router_for(config: GatewayConfig, seed: int = 0) -> Router:
    return Router(config, rng=random.Random(seed), clock_ms=epoch_ms)


def boom(status: int = 500) -> ProviderStatusError:
    return ProviderStatusError(status, b"upstream says no")


# ---------------------------------------------------------------------- the policy


def test_backoff_doubles_and_is_capped() -> None:
    policy = RetryPolicy(num_retries=10, retry_after_s=1.0)
    assert [backoff_s(policy, n) for n in range(7)] == [1, 2, 4, 8, 16, MAX_BACKOFF_S, 30]
    big = RetryPolicy(num_retries=10, retry_after_s=45.0)
    assert [backoff_s(big, n) for n in range(3)] == [45.0, 45.0, 45.0]
    assert backoff_s(RetryPolicy(num_retries=1, retry_after_s=0.0), 5) == 0.0
    assert backoff_s(policy, 10_000) == MAX_BACKOFF_S


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (ProviderTimeout("slow"), True),
        (ProviderConnectError("refused"), True),
        (ProviderStatusError(408, b""), True),
        (ProviderStatusError(429, b""), True),
        (ProviderStatusError(503, b""), True),
        (ProviderStatusError(400, b""), False),
        (ProviderStatusError(404, b""), False),
        (RuntimeError("bug"), False),
    ],
)
def test_what_is_retryable(error: Exception, retryable: bool) -> None:
    assert is_retryable(error) is retryable


# ---------------------------------------------------------------------- the loop


async def test_a_retryable_failure_moves_to_another_deployment(autojump_clock: MockClock) -> None:
    config = make_config(dep("a"), dep("b"), dep("c"), num_retries=2)
    for seed in range(20):
        router = router_for(config, seed)
        state = state_of(config)
        first: list[str] = []

        async def call(d: Deployment, first: list[str] = first) -> str:
            if not first:
                first.append(d.id)
                raise ProviderTimeout("no answer")
            return d.id

        result = await router.run(state, call)
        assert result.value != first[0]
        assert [a.deployment_id for a in result.attempts] == [first[0], result.value]
        assert [a.ok for a in result.attempts] == [False, True]
        assert isinstance(result.attempts[0].error, ProviderTimeout)
        assert result.group_used == "g"
        assert result.deployment.id == result.value
        assert state.attempts == list(result.attempts)


async def test_backoff_waits_are_exact_and_the_last_error_is_raised(
    autojump_clock: MockClock,
) -> None:
    config = make_config(dep("a"), dep("b"), dep("c"), dep("d"), num_retries=3,
                         retry_after_s=0.5)
    errors = [ProviderTimeout(f"timeout {i}") for i in range(4)]
    upstream = Upstream({i: [e] for i, e in zip("abcd", errors, strict=True)})
    state = state_of(config)
    with pytest.raises(ProviderTimeout) as caught:
        await router_for(config).run(state, upstream)
    assert upstream.times == [0.0, 0.5, 1.5, 3.5]
    assert sorted(upstream.ids) == ["a", "b", "c", "d"]  # each failed one avoided
    assert caught.value is errors["abcd".index(upstream.ids[-1])]
    assert [a.ok for a in state.attempts] == [False] * 4
    assert trio.current_time() == 3.5  # no wait after the last attempt


async def test_latency_is_measured_on_trios_clock(autojump_clock: MockClock) -> None:
    config = make_config(dep("a"))
    result = await router_for(config).run(state_of(config), Upstream(latency_s=2.25))
    assert result.attempts[0].latency_s == 2.25
    # And the mirror learned it (ms).
    view = router_for(config).mirror.overlay(state_of(config).groups[0], NOW_MS)
    assert view.deployments[0].latency_ms is None  # another router's mirror: nothing
    router = router_for(config)
    await router.run(state_of(config), Upstream(latency_s=0.5))
    view = router.mirror.overlay(state_of(config).groups[0], epoch_ms())
    assert view.deployments[0].latency_ms == 500.0
    assert view.deployments[0].rpm_used == 1


async def test_a_non_retryable_error_is_raised_at_once(autojump_clock: MockClock) -> None:
    config = make_config(
        dep("a"), dep("b"), dep("x", "fb"), num_retries=3, retry_after_s=1.0, allowed_fails=1,
        fallbacks={"g": ("fb",)},
    )
    bad = boom(400)
    upstream = Upstream({"a": [bad], "b": [bad]})
    state = state_of(config)
    router = router_for(config)
    with pytest.raises(ProviderStatusError) as caught:
        await router.run(state, upstream)
    assert caught.value is bad
    assert len(upstream.calls) == 1
    assert trio.current_time() == 0.0
    assert len(state.attempts) == 1
    # The request's fault, not the deployment's: no failure, no cooldown.
    view = router.mirror.overlay(state.groups[0], epoch_ms())
    assert all(s.fails == 0 and s.cooldown_until_ms == 0 for s in view.deployments)


async def test_other_exceptions_propagate_at_once(autojump_clock: MockClock) -> None:
    config = make_config(dep("a"), dep("b"))
    upstream = Upstream({"a": [RuntimeError("bug")], "b": [RuntimeError("bug")]})
    state = state_of(config)
    with pytest.raises(RuntimeError, match="bug"):
        await router_for(config).run(state, upstream)
    assert len(upstream.calls) == 1
    assert [a.ok for a in state.attempts] == [False]


async def test_fallbacks_are_tried_in_order(autojump_clock: MockClock) -> None:
    config = make_config(
        dep("a", "g"), dep("b", "fb1"), dep("c", "fb2"), dep("d", "fb3"),
        num_retries=1, retry_after_s=1.0, allowed_fails=10,
        fallbacks={"g": ("fb1", "fb2", "fb3")},
    )
    upstream = Upstream({"a": [boom(), boom(502)], "b": [boom(429), ProviderTimeout("t")]})
    result = await router_for(config).run(state_of(config), upstream)
    assert upstream.ids == ["a", "a", "b", "b", "c"]  # a lone deployment is retried
    # Backoff inside a group only; a fallback's first attempt goes at once.
    assert upstream.times == [0.0, 1.0, 1.0, 2.0, 2.0]
    assert result.group_used == "fb2"
    assert result.value == "ok:c"
    assert [(a.deployment_id, a.ok) for a in result.attempts] == [
        ("a", False), ("a", False), ("b", False), ("b", False), ("c", True)
    ]


async def test_when_everything_fails_the_last_error_is_raised(autojump_clock: MockClock) -> None:
    config = make_config(dep("a", "g"), dep("b", "fb"), num_retries=1, allowed_fails=10,
                         fallbacks={"g": ("fb",)})
    last = ProviderConnectError("gone")
    upstream = Upstream({"a": [boom(), boom()], "b": [boom(503), last]})
    state = state_of(config)
    with pytest.raises(ProviderConnectError) as caught:
        await router_for(config).run(state, upstream)
    assert caught.value is last
    assert upstream.ids == ["a", "a", "b", "b"]
    assert len(state.attempts) == 4  # kept for Router.record, though run raised


async def test_cooling_deployments_are_skipped(autojump_clock: MockClock) -> None:
    config = make_config(dep("a", weight=100), dep("b"))
    for seed in range(30):
        state = state_of(config, rows={"a": {"cooldown_until_ms": NOW_MS + 60_000}})
        upstream = Upstream()
        await router_for(config, seed).run(state, upstream)
        assert upstream.ids == ["b"]


async def test_primary_cooling_goes_to_the_fallback(autojump_clock: MockClock) -> None:
    config = make_config(dep("a"), dep("x", "fb"), fallbacks={"g": ("fb",)})
    state = state_of(config, rows={"a": {"cooldown_until_ms": NOW_MS + 1}})
    upstream = Upstream()
    result = await router_for(config).run(state, upstream)
    assert (upstream.ids, result.group_used) == (["x"], "fb")


async def test_all_cooling_raises_no_deployment_available(autojump_clock: MockClock) -> None:
    config = make_config(dep("a"), dep("b"), dep("x", "fb"), fallbacks={"g": ("fb",)})
    state = state_of(config, rows={
        "a": {"cooldown_until_ms": NOW_MS + 7000},
        "b": {"cooldown_until_ms": NOW_MS + 4000},
        "x": {"cooldown_until_ms": NOW_MS + 9000},
    })
    upstream = Upstream()
    with pytest.raises(NoDeploymentAvailable) as caught:
        await router_for(config).run(state, upstream)
    assert upstream.calls == []
    assert caught.value.group == "g"
    assert caught.value.retry_after_s == 4.0
    assert caught.value.reason == "cooldown"
    decision = router_for(config).decide(state)
    assert (decision.status, decision.retry_after_s) == (503, 4.0)  # type: ignore[union-attr]


async def test_all_at_their_rpm_is_a_limits_rejection(autojump_clock: MockClock) -> None:
    config = make_config(dep("a", rpm=5), dep("b", tpm=1000))
    state = state_of(config, estimate_tokens=600,
                     rows={"a": {"rpm_used": 5}, "b": {"tpm_used": 500}})
    with pytest.raises(NoDeploymentAvailable) as caught:
        await router_for(config).run(state, Upstream())
    assert (caught.value.reason, caught.value.retry_after_s) == ("limits", 50.0)
    decision = router_for(config).decide(state)
    assert (decision.check, decision.status) == ("routing", 429)  # type: ignore[union-attr]
    assert router_for(config).decide(state_of(config)).degraded is False


async def test_a_failure_seen_locally_steers_later_requests(autojump_clock: MockClock) -> None:
    """allowed_fails=1: one failure cools a deployment down in this process at once."""
    config = make_config(dep("a"), dep("b"), dep("c"), allowed_fails=1, cooldown_s=10)
    router = router_for(config, seed=4)
    first = state_of(config, request_id="r1")

    async def fail_first(d: Deployment) -> str:
        if not first.attempts:
            raise ProviderTimeout("slow")
        return d.id

    await router.run(first, fail_first)
    failed = first.attempts[0].deployment_id
    # Later requests read Redis before it heard of the failure (a stale, clean state);
    # the mirror still keeps them away from the failed deployment for 10 s.
    seen: set[str] = set()
    for i in range(40):
        upstream = Upstream()
        await router.run(state_of(config, request_id=f"r{i}", now_ms=epoch_ms()), upstream)
        seen.update(upstream.ids)
        await trio.sleep(0.125)
    assert failed not in seen
    assert trio.current_time() == 5.0
    await trio.sleep(4.999)
    upstream = Upstream()
    for _ in range(20):
        await router.run(state_of(config, now_ms=epoch_ms()), upstream)
    assert failed not in upstream.ids
    await trio.sleep(0.001)  # the cooldown ends at exactly 10 s
    seen.clear()
    for i in range(40):
        upstream = Upstream()
        await router.run(state_of(config, request_id=f"s{i}", now_ms=epoch_ms()), upstream)
        seen.update(upstream.ids)
    assert failed in seen


async def test_allowed_fails_count_across_requests(autojump_clock: MockClock) -> None:
    lone = make_config(dep("a"), allowed_fails=3, cooldown_s=10, num_retries=0)
    router = router_for(lone)
    for i in range(2):
        with pytest.raises(ProviderStatusError):
            await router.run(state_of(lone, request_id=f"r{i}"), Upstream({"a": [boom()]}))
    await router.run(state_of(lone), Upstream())  # 2 failures < 3: still called
    with pytest.raises(ProviderStatusError):
        await router.run(state_of(lone), Upstream({"a": [boom()]}))
    with pytest.raises(NoDeploymentAvailable) as caught:
        await router.run(state_of(lone), Upstream())
    assert caught.value.retry_after_s == 10.0


async def test_least_busy_goes_to_the_claimed_deployment_first(autojump_clock: MockClock) -> None:
    config = make_config(dep("a"), dep("b"), strategy="least-busy")
    state = state_of(config, claimed="b", rows={"a": {"in_flight": 0}, "b": {"in_flight": 4}})
    upstream = Upstream()
    await router_for(config).run(state, upstream)
    assert upstream.ids == ["b"]
    # A claimed deployment that cools down by now (seen locally) is not used.
    router = router_for(config)
    router.mirror.note_failure("b", now_ms=NOW_MS, allowed_fails=1, cooldown_s=5)
    upstream = Upstream()
    await router.run(state_of(config, claimed="b"), upstream)
    assert upstream.ids == ["a"]


async def test_degraded_least_busy_counts_this_processs_calls(autojump_clock: MockClock) -> None:
    config = make_config(dep("a"), dep("b"), dep("c"), strategy="least-busy")
    router = router_for(config, seed=9)
    release = trio.Event()
    picked: list[str] = []

    async def hold(d: Deployment) -> str:
        picked.append(d.id)
        await release.wait()
        return d.id

    def degraded() -> RoutingState:
        state = state_of(config)
        return attrs.evolve(
            state, groups=tuple(attrs.evolve(g, degraded=True) for g in state.groups)
        )

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(router.run, degraded(), hold)
            await trio.testing.wait_all_tasks_blocked()
        assert sorted(picked) == ["a", "b", "c"]
        release.set()
    view = router.mirror.snapshot("g", config.groups["g"], epoch_ms())
    assert [s.in_flight for s in view.deployments] == [0, 0, 0]


async def test_attempts_are_provider_errors_or_ok(autojump_clock: MockClock) -> None:
    config = make_config(dep("a"), dep("b"), num_retries=1)
    state = state_of(config)
    with pytest.raises(ProviderError):
        await router_for(config).run(state, Upstream({"a": [boom()], "b": [boom()]}))
    for deployment_id, ok, error, latency_s in state.attempts:
        assert deployment_id in {"a", "b"}
        assert not ok
        assert isinstance(error, ProviderStatusError)
        assert latency_s == 0.0
