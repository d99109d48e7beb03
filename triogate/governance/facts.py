"""The facts budgets and rate limits need about one request, and their settings.

Records only. :class:`RequestFacts` is what the handler knows before the model call (the
estimates are computed and capped by the handler); :class:`CheckSettings` is built once
from the configuration and passed to both participants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, final

import attrs

if TYPE_CHECKING:
    from triogate.config_settings import GovernanceSettings, PolicySettings
    from triogate.governance.principals import Limits, Principal

#: What a check does when Redis does not answer.
FailurePolicy = Literal["fail-open", "fail-closed"]

_non_negative = attrs.validators.ge(0)
_positive = attrs.validators.gt(0)
_policy = attrs.validators.in_(("fail-open", "fail-closed"))


@final
@attrs.frozen(kw_only=True)
class RequestFacts:
    """One request, as budgets and rate limits see it.

    Attributes:
        request_id: unique per request; the idempotency marker of every settlement, and
            the member name of its reservations and parallel slots.
        model_group: the model group asked for (per-model rate limits).
        estimate_nanousd: cost reserved against budgets until the actual cost is known
            (already capped by the handler).
        estimate_tokens: tokens reserved against TPM windows until settled.
        now_ms: epoch ms at admission, from the app's injectable clock; every script
            takes time from here, never from ``TIME``.
    """

    request_id: str = attrs.field(validator=attrs.validators.min_len(1))
    model_group: str
    estimate_nanousd: int = attrs.field(validator=_non_negative)
    estimate_tokens: int = attrs.field(validator=_non_negative)
    now_ms: int = attrs.field(validator=_non_negative)


@final
@attrs.frozen(kw_only=True)
class CheckSettings:
    """How budgets and rate limits talk to Redis and what they do when it is down.

    Attributes:
        budgets_policy: ``"fail-open"`` decides from process-local state when Redis does
            not answer; ``"fail-closed"`` refuses with 503.
        rate_limits_policy: the same, for rate limits.
        lease_ms: how long a reservation or a parallel slot outlives a process that died
            holding it (purged by the next script that looks).
        settle_marker_ttl_ms: how long a settlement's idempotency marker lives; a journal
            replay older than this would apply twice.
        budget_retention_ms: how long a budget period's keys outlive the period (for
            reports and late settlements).
        backend: the batch backend name for counters.
        proxy_limits: the proxy-wide budget (``litellm_settings.max_budget`` and
            ``budget_duration``) every governed request reserves against; None = none.
    """

    budgets_policy: FailurePolicy = attrs.field(default="fail-open", validator=_policy)
    rate_limits_policy: FailurePolicy = attrs.field(default="fail-open", validator=_policy)
    lease_ms: int = attrs.field(default=600_000, validator=_positive)
    settle_marker_ttl_ms: int = attrs.field(default=86_400_000, validator=_positive)
    budget_retention_ms: int = attrs.field(default=86_400_000, validator=_non_negative)
    backend: str = "counters"
    proxy_limits: Limits | None = None

    @classmethod
    def from_config(
        cls, policies: PolicySettings, governance: GovernanceSettings, *,
        backend: str = "counters", proxy_limits: Limits | None = None,
    ) -> CheckSettings:
        """Build from the ``triogate.policies`` and ``triogate.governance`` sections."""
        return cls(
            budgets_policy=policies.budgets,
            rate_limits_policy=policies.rate_limits,
            lease_ms=max(1, round(governance.lease_s * 1000)),
            backend=backend,
            proxy_limits=proxy_limits,
        )


#: Wire codes of window kinds, as ``rate_admit.lua`` and ``rate_settle.lua`` take them.
WINDOW_CODES = {"rpm": "r", "tpm": "t", "parallel": "p"}


@final
@attrs.frozen(kw_only=True)
class Window:
    """One rate window of one principal.

    Attributes:
        kind: ``"rpm"``, ``"tpm"`` or ``"parallel"`` (see ``keys.RPM`` ...).
        key: its Redis key (``keys.rate_window_key``); also its name in local state.
        limit: requests per minute, tokens per minute, or requests in flight.
        model_group: set for a per-model window.
    """

    kind: str = attrs.field(validator=attrs.validators.in_(tuple(WINDOW_CODES)))
    key: str
    limit: int = attrs.field(validator=_non_negative)
    model_group: str | None = None

    @property
    def code(self) -> str:
        """The kind as the scripts take it: ``r``, ``t`` or ``p``."""
        return WINDOW_CODES[self.kind]


def principal_label(principal: Principal) -> str:
    """How messages name a principal: its alias, else its id (a key's hash, shortened)."""
    if principal.alias:
        return principal.alias
    return principal.id[:12] if principal.kind == "key" else principal.id
