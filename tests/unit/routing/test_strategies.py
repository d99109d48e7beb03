"""Strategies and availability rules: pure functions over deployment states."""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from triogate.routing import cooldowns, strategies
from triogate.routing.state import DeploymentState

from .support import NOW_MS, dep

if TYPE_CHECKING:
    from collections.abc import Iterator

    from triogate.config import Deployment


def states(*rows: tuple[Deployment, dict[str, Any]]) -> list[DeploymentState]:
    return [DeploymentState(deployment=d, **fields) for d, fields in rows]


def draw(strategy: str, pool: list[DeploymentState], n: int, *, seed: int = 7,
         estimate_tokens: int = 0, exclude: frozenset[str] = frozenset()) -> Counter[str]:
    rng = random.Random(seed)
    picks: Counter[str] = Counter()
    for _ in range(n):
        chosen = strategies.choose(
            strategy, pool, now_ms=NOW_MS, estimate_tokens=estimate_tokens, rng=rng,
            exclude=exclude,
        )
        picks[chosen.id if chosen else "-"] += 1
    return picks


def draw_sequence(pool: list[DeploymentState], *, seed: int, n: int) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(n):
        chosen = strategies.choose("simple-shuffle", pool, now_ms=NOW_MS, estimate_tokens=0,
                                   rng=rng)
        assert chosen is not None
        yield chosen.id


def test_weighted_shuffle_follows_weights() -> None:
    pool = states((dep("a", weight=1), {}), (dep("b", weight=3), {}), (dep("c", weight=6), {}))
    n = 20_000
    for seed in (1, 2, 3):
        picks = draw("simple-shuffle", pool, n, seed=seed)
        assert abs(picks["a"] / n - 0.1) < 0.015
        assert abs(picks["b"] / n - 0.3) < 0.015
        assert abs(picks["c"] / n - 0.6) < 0.015


def test_seeded_draws_repeat() -> None:
    pool = states((dep("a"), {}), (dep("b"), {}), (dep("c"), {}))
    first = list(draw_sequence(pool, seed=5, n=50))
    again = list(draw_sequence(pool, seed=5, n=50))
    assert first == again
    assert set(first) == {"a", "b", "c"}


def test_shuffle_skips_a_deployment_at_its_rpm() -> None:
    pool = states((dep("a", rpm=10, weight=100), {"rpm_used": 10}), (dep("b"), {"rpm_used": 50}))
    assert draw("simple-shuffle", pool, 200) == Counter({"b": 200})
    pool = states((dep("a", rpm=10, weight=100), {"rpm_used": 9}), (dep("b"), {}))
    assert draw("simple-shuffle", pool, 200)["a"] > 150


@pytest.mark.parametrize(
    ("tpm_used", "estimate", "eligible"),
    [(900, 100, True), (900, 101, False), (0, 5000, True), (1000, 0, False), (999, 1, True)],
)
def test_tpm_limit_counts_the_estimate(tpm_used: int, estimate: int, eligible: bool) -> None:
    pool = states((dep("a", tpm=1000), {"tpm_used": tpm_used}), (dep("b"), {"tpm_used": 10**6}))
    picks = draw("usage-based-routing", pool, 20, estimate_tokens=estimate)
    assert picks == Counter({"a": 20} if eligible else {"b": 20})


def test_usage_based_picks_lowest_tpm_then_lowest_rpm() -> None:
    pool = states(
        (dep("a"), {"tpm_used": 300, "rpm_used": 1}),
        (dep("b"), {"tpm_used": 100, "rpm_used": 9}),
        (dep("c"), {"tpm_used": 200, "rpm_used": 0}),
    )
    assert draw("usage-based-routing", pool, 50) == Counter({"b": 50})
    assert draw("usage-based-routing-v2", pool, 50) == Counter({"b": 50})
    tied = states(
        (dep("a"), {"tpm_used": 100, "rpm_used": 5}),
        (dep("b"), {"tpm_used": 100, "rpm_used": 2}),
        (dep("c"), {"tpm_used": 400, "rpm_used": 0}),
    )
    assert draw("usage-based-routing", tied, 50) == Counter({"b": 50})


def test_full_ties_are_broken_at_random() -> None:
    pool = states((dep("a"), {}), (dep("b"), {}), (dep("c"), {}))
    for strategy in ("usage-based-routing", "least-busy", "latency-based-routing"):
        picks = draw(strategy, pool, 3000)
        assert set(picks) == {"a", "b", "c"}
        assert min(picks.values()) > 850


def test_least_busy_picks_fewest_in_flight() -> None:
    pool = states(
        (dep("a"), {"in_flight": 3}), (dep("b"), {"in_flight": 1}), (dep("c"), {"in_flight": 2})
    )
    assert draw("least-busy", pool, 50) == Counter({"b": 50})


def test_latency_based_picks_lowest_and_tries_unknown_first() -> None:
    pool = states(
        (dep("a"), {"latency_ms": 80.0}), (dep("b"), {"latency_ms": 20.5}),
        (dep("c"), {"latency_ms": 40.0}),
    )
    assert draw("latency-based-routing", pool, 50) == Counter({"b": 50})
    pool = states((dep("a"), {"latency_ms": 5.0}), (dep("b"), {"latency_ms": None}))
    assert draw("latency-based-routing", pool, 50) == Counter({"b": 50})


def test_cooling_deployments_are_skipped_until_their_cooldown_ends() -> None:
    pool = states((dep("a", weight=100), {"cooldown_until_ms": NOW_MS + 1}), (dep("b"), {}))
    assert draw("simple-shuffle", pool, 100) == Counter({"b": 100})
    pool = states((dep("a"), {"cooldown_until_ms": NOW_MS}), (dep("b"), {"tpm_used": 5}))
    assert draw("usage-based-routing", pool, 10) == Counter({"a": 10})


def test_none_when_every_deployment_cools_down() -> None:
    pool = states((dep("a"), {"cooldown_until_ms": NOW_MS + 5}),
                  (dep("b"), {"cooldown_until_ms": NOW_MS + 9}))
    for strategy in strategies.STRATEGY_NAMES:
        assert draw(strategy, pool, 5) == Counter({"-": 5})


def test_exclude_is_avoided_while_others_remain() -> None:
    pool = states((dep("a", weight=1000), {}), (dep("b"), {}), (dep("c"), {}))
    picks = draw("simple-shuffle", pool, 300, exclude=frozenset({"a"}))
    assert set(picks) == {"b", "c"}
    assert draw("least-busy", pool, 20, exclude=frozenset({"a", "b", "c"}))["-"] == 0
    lone = states((dep("a"), {}))
    assert draw("latency-based-routing", lone, 5, exclude=frozenset({"a"})) == Counter({"a": 5})


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown routing strategy"):
        strategies.normalise("round-robin")


def test_unavailable_reports_the_soonest_and_why() -> None:
    minute_end_s = 50.0  # NOW_MS is 10 s into its minute
    cooling = states((dep("a"), {"cooldown_until_ms": NOW_MS + 3000}),
                     (dep("b"), {"cooldown_until_ms": NOW_MS + 7000}))
    assert cooldowns.unavailable(cooling, now_ms=NOW_MS, estimate_tokens=0) == (3.0, "cooldown")
    capped = states((dep("a", rpm=1), {"rpm_used": 1}),
                    (dep("b"), {"cooldown_until_ms": NOW_MS + 70_000}))
    assert cooldowns.unavailable(capped, now_ms=NOW_MS, estimate_tokens=0) == (
        minute_end_s, "limits"
    )
    both = states((dep("a", rpm=1), {"rpm_used": 1, "cooldown_until_ms": NOW_MS + 90_000}))
    assert cooldowns.unavailable(both, now_ms=NOW_MS, estimate_tokens=0) == (90.0, "cooldown")


@pytest.mark.parametrize(
    ("fails", "allowed", "cooldown_s", "expected"),
    [(1, 3, 5, False), (3, 3, 5, True), (4, 3, 5, True), (1, 0, 5, True), (1, 1, 5, True),
     (9, 3, 0, False)],
)
def test_failure_starts_cooldown_when_the_count_reaches_allowed_fails(
    fails: int, allowed: int, cooldown_s: float, expected: bool
) -> None:
    assert cooldowns.failure_starts_cooldown(
        fails, allowed_fails=allowed, cooldown_s=cooldown_s
    ) is expected
