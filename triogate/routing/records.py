"""Routing's records, in a leaf module so that cooldowns, retries, state and strategies
can all name them without importing one another."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, final

import attrs

if TYPE_CHECKING:
    from triogate.config import Deployment


class Attempt(NamedTuple):
    """One call of one deployment. A tuple, so ``(id, ok, error, latency_s) = a`` works.

    Attributes:
        deployment_id: the deployment called.
        ok: whether the call returned.
        error: what it raised, when it did not.
        latency_s: time from the call to its return or error (Trio's clock, seconds);
            for a stream, until the first event.
    """

    deployment_id: str
    ok: bool
    error: Exception | None
    latency_s: float


@final
@attrs.frozen(kw_only=True)
class DeploymentState:
    """One deployment as seen at ``RoutingState.now_ms``.

    Attributes:
        deployment: the configured deployment.
        rpm_used: successful requests this minute.
        tpm_used: tokens used this minute.
        fails: failures this minute (retryable errors only).
        cooldown_until_ms: epoch ms its cooldown ends; 0 when none.
        in_flight: requests in flight (least-busy claims in Redis; this process's own
            when degraded).
        latency_ms: latency EWMA in ms; None when unknown.
    """

    deployment: Deployment
    rpm_used: int = 0
    tpm_used: int = 0
    fails: int = 0
    cooldown_until_ms: int = 0
    in_flight: int = 0
    latency_ms: float | None = None

    @property
    def id(self) -> str:
        """The deployment's id."""
        return self.deployment.id
