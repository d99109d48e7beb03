"""Routing strategies: pure functions choosing one deployment of a group.

Every strategy sees the same candidates: deployments that do not cool down and are under
their RPM/TPM limits this minute (:func:`candidates`). Deployments that already failed in
this request (``exclude``) are avoided while others remain. Randomness comes from the
``random.Random`` passed in, so tests seed it and get the same picks every time.

* ``simple-shuffle``: weighted random by ``Deployment.weight``.
* ``usage-based-routing`` (and ``-v2``): lowest TPM used this minute, then lowest RPM.
* ``least-busy``: fewest requests in flight.
* ``latency-based-routing``: lowest latency EWMA; unknown latency counts as 0, so a new
  deployment gets tried.

Ties left by a strategy's ordering are broken at random, so equal deployments share load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.routing import cooldowns

if TYPE_CHECKING:
    import random
    from collections.abc import Callable, Sequence

    from triogate.routing.state import DeploymentState

SIMPLE_SHUFFLE = "simple-shuffle"
LEAST_BUSY = "least-busy"
USAGE_BASED = "usage-based-routing"
USAGE_BASED_V2 = "usage-based-routing-v2"
LATENCY_BASED = "latency-based-routing"
#: The strategies, by canonical name.
STRATEGY_NAMES = (SIMPLE_SHUFFLE, LEAST_BUSY, USAGE_BASED, LATENCY_BASED)


def normalise(strategy: str) -> str:
    """The strategy's canonical name (``usage-based-routing-v2`` is ``usage-based-routing``).

    Raises:
        ValueError: not a known strategy.
    """
    if strategy == USAGE_BASED_V2:
        return USAGE_BASED
    if strategy not in STRATEGY_NAMES:
        raise ValueError(f"unknown routing strategy {strategy!r}")
    return strategy


def candidates(
    states: Sequence[DeploymentState],
    *,
    now_ms: int,
    estimate_tokens: int,
    exclude: frozenset[str] = frozenset(),
) -> list[DeploymentState]:
    """Deployments that may be called now: not cooling down, under their limits.

    Those in ``exclude`` are left out unless nothing else remains (a group of one
    deployment retries that deployment).
    """
    ok = [
        s
        for s in states
        if not cooldowns.is_cooling(s.cooldown_until_ms, now_ms)
        and cooldowns.under_limits(s, estimate_tokens)
    ]
    preferred = [s for s in ok if s.id not in exclude]
    return preferred or ok


def _lowest(
    states: Sequence[DeploymentState],
    key: Callable[[DeploymentState], tuple[float, ...]],
    rng: random.Random,
) -> DeploymentState:
    best = min(key(s) for s in states)
    tied = [s for s in states if key(s) == best]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


def weighted_shuffle(states: Sequence[DeploymentState], rng: random.Random) -> DeploymentState:
    """One deployment at random, each with probability proportional to its weight."""
    total = sum(s.deployment.weight for s in states)
    point = rng.random() * total
    for s in states:
        point -= s.deployment.weight
        if point < 0:
            return s
    return states[-1]  # float rounding put the point at the very end


def usage_based(states: Sequence[DeploymentState], rng: random.Random) -> DeploymentState:
    """The deployment with the lowest TPM used this minute (tie: lowest RPM, then random)."""
    return _lowest(states, lambda s: (s.tpm_used, s.rpm_used), rng)


def least_busy(states: Sequence[DeploymentState], rng: random.Random) -> DeploymentState:
    """The deployment with the fewest requests in flight (tie: random)."""
    return _lowest(states, lambda s: (s.in_flight,), rng)


def latency_based(states: Sequence[DeploymentState], rng: random.Random) -> DeploymentState:
    """The deployment with the lowest latency EWMA; unknown counts as 0 (tie: random)."""
    return _lowest(states, lambda s: (s.latency_ms or 0.0,), rng)


_BY_NAME: dict[str, Callable[[Sequence[DeploymentState], random.Random], DeploymentState]] = {
    SIMPLE_SHUFFLE: weighted_shuffle,
    USAGE_BASED: usage_based,
    LEAST_BUSY: least_busy,
    LATENCY_BASED: latency_based,
}


def choose(
    strategy: str,
    states: Sequence[DeploymentState],
    *,
    now_ms: int,
    estimate_tokens: int,
    rng: random.Random,
    exclude: frozenset[str] = frozenset(),
) -> DeploymentState | None:
    """Pick a deployment of one group with ``strategy``; None if none may be called.

    Args:
        strategy: one of the strategy names (``-v2`` accepted).
        states: the group's deployments.
        now_ms: epoch ms, for cooldowns.
        estimate_tokens: the request's estimated tokens, for TPM limits.
        rng: the source of randomness (seeded in tests).
        exclude: ids that failed in this request; avoided while others remain.
    """
    pool = candidates(states, now_ms=now_ms, estimate_tokens=estimate_tokens, exclude=exclude)
    if not pool:
        return None
    return _BY_NAME[normalise(strategy)](pool, rng)
