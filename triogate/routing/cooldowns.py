"""Cooldown and availability rules, as pure functions over epoch milliseconds.

The same rules run in three places and must agree: ``routing_state.lua`` (the least-busy
claim), ``routing_record.lua`` (entering a cooldown) and the Python side (strategies,
the process-local mirror, and the ``retry_after_s`` of :class:`NoDeploymentAvailable`).
A change here needs the same change in the scripts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.routing.errors import NoDeploymentAvailable as NoDeploymentAvailable
from triogate.routing.keys import MINUTE_MS

if TYPE_CHECKING:
    from collections.abc import Iterable

    from triogate.routing.records import DeploymentState


def threshold(allowed_fails: int) -> int:
    """Failures in one minute that start a cooldown: ``allowed_fails``, at least 1.

    The brief's rule is "when the count reaches allowed_fails"; ``allowed_fails: 0``
    therefore behaves as 1 (the first failure cools the deployment down).
    """
    return max(1, allowed_fails)


def is_cooling(cooldown_until_ms: int, now_ms: int) -> bool:
    """Whether a deployment whose cooldown ends at ``cooldown_until_ms`` cools down now."""
    return cooldown_until_ms > now_ms


def under_limits(state: DeploymentState, estimate_tokens: int) -> bool:
    """Whether the deployment is under its RPM and TPM limits for this minute.

    TPM counts the request's estimate, except on a deployment that has used no tokens this
    minute: a request bigger than a whole minute's limit would otherwise never be served.
    """
    d = state.deployment
    if d.rpm is not None and state.rpm_used >= d.rpm:
        return False
    if d.tpm is None or state.tpm_used == 0:
        return True
    return state.tpm_used < d.tpm and state.tpm_used + estimate_tokens <= d.tpm


def failure_starts_cooldown(
    fails_after: int, *, allowed_fails: int, cooldown_s: float
) -> bool:
    """Whether the failure that brought this minute's count to ``fails_after`` cools down."""
    return cooldown_s > 0 and fails_after >= threshold(allowed_fails)


def next_minute_ms(now_ms: int) -> int:
    """The epoch ms where the usage window after the one containing ``now_ms`` starts."""
    return (now_ms // MINUTE_MS + 1) * MINUTE_MS


def unavailable(
    states: Iterable[DeploymentState], *, now_ms: int, estimate_tokens: int
) -> tuple[float, str]:
    """For deployments none of which may be called: (seconds until one may, reason).

    A deployment cooling down becomes available at the end of its cooldown (and, if it is
    also over a limit, at the later of that and the next minute); one over its limits at the
    next minute. The result is the soonest of these, and ``"limits"`` when any deployment is
    held back by limits alone, else ``"cooldown"``.
    """
    soonest_ms: int | None = None
    reason = "cooldown"
    for s in states:
        at_ms = now_ms
        if is_cooling(s.cooldown_until_ms, now_ms):
            at_ms = s.cooldown_until_ms
        if not under_limits(s, estimate_tokens):
            at_ms = max(at_ms, next_minute_ms(now_ms))
            if not is_cooling(s.cooldown_until_ms, now_ms):
                reason = "limits"
        soonest_ms = at_ms if soonest_ms is None else min(soonest_ms, at_ms)
    if soonest_ms is None:
        return 0.0, reason
    return max(0.0, (soonest_ms - now_ms) / 1000), reason
