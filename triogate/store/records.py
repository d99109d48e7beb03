"""The store's records, and the small pure helpers around them (keys, durations).

Rows come back from the store as frozen attrs records whose numeric fields carry their
unit (``_ms``, ``_s``, ``_nanousd``). The SQL columns keep LiteLLM's names where LiteLLM
has one (``expires_at``, ``created_at``, ``tpm_limit``), so that its admin tooling maps;
``schema.py`` holds the columns and ``queries.py`` the mapping between the two.

Money is integer nano-USD everywhere: exact sums, no float drift.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import TYPE_CHECKING, Any, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping

#: ``SpendLogRow.api`` values.
APIS = ("chat", "messages", "responses", "embeddings", "moderations")
#: ``SpendLogRow.status`` values.
STATUSES = ("success", "error", "rejected", "cancelled")

_DURATION = re.compile(r"^\s*(\d+)\s*(mo|s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400, "mo": 30 * 86_400}


def parse_duration(text: str) -> int:
    """Seconds in a LiteLLM budget duration: ``"30s"``, ``"15m"``, ``"1h"``, ``"1d"``,
    ``"1w"``, ``"1mo"`` (a month is 30 days, as LiteLLM counts it).

    Raises:
        ValueError: anything else, including zero, with the accepted forms in the message.
    """
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) == 0:
        raise ValueError(
            f"invalid duration {text!r}: expected a positive integer followed by "
            "s, m, h, d, w or mo (e.g. '30s', '15m', '1h', '30d', '1mo')"
        )
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def hash_key(raw: str) -> str:
    """The SHA-256 hex digest of a raw key: the only form a key is stored or cached in."""
    return hashlib.sha256(raw.encode()).hexdigest()


def generate_key() -> str:
    """A new virtual key: ``"sk-"`` + 32 random bytes, URL-safe base64 (43 chars)."""
    return "sk-" + secrets.token_urlsafe(32)


def key_hint(raw: str) -> str:
    """What may be shown of a key: ``"sk-...abcd"`` (its last 4 characters)."""
    prefix = "sk-" if raw.startswith("sk-") else ""
    return f"{prefix}...{raw[-4:]}"


# --------------------------------------------------------------------------- rows
# Field order follows the columns. Mappings are plain dicts decoded from JSON columns.


@final
@attrs.frozen(kw_only=True)
class KeyRow:
    """A virtual key. The raw key is never stored: ``token_hash`` is its SHA-256.

    Attributes:
        token_hash: SHA-256 hex of the raw key (the primary key).
        key_alias: a display name chosen by the admin.
        key_hint: ``"sk-...abcd"``, enough to recognise a key, not to use it.
        team_id, user_id: the team and user the key belongs to.
        models: model groups it may use; empty = any.
        max_budget_nanousd: spend allowed per budget period (nano-USD).
        budget_duration: the period as written (``"30d"``); budget_duration_s in seconds.
        budget_anchor_s: epoch second periods count from (creation or last duration change).
        tpm_limit, rpm_limit: tokens / requests per minute.
        max_parallel_requests: requests in flight at once.
        model_rpm_limit, model_tpm_limit: per-model-group limits.
        metadata: free-form JSON object.
        tags: tags applied to every request of the key.
        expires_at_ms: when the key stops working (epoch ms); None = never.
        blocked: refuse every request.
        created_at_ms, updated_at_ms: epoch ms.
        aliases: model aliases of this key (requested name → model group).
        budget_id: a shared budget (``budgets`` table) whose limits apply to the key.
        soft_budget_nanousd: spend per period past which an alert is sent (not refused).
        model_max_budget: model group → ``{"budget_limit_nanousd", "time_period"}``.
        secret_hash: SHA-256 of the current secret once the key was rotated (None: the
            secret is the one ``token_hash`` is the hash of); the id never changes.
        previous_secret_hash, previous_secret_expires_at_ms: the secret before the last
            rotation, still accepted until then (a grace period).
        auto_rotate, rotation_interval: scheduled rotation (``"30d"``).
        key_rotation_at_ms: when the next scheduled rotation is due.
        last_rotation_at_ms, rotation_count: the last rotation, and how many there were.
    """

    token_hash: str
    key_alias: str | None = None
    key_hint: str | None = None
    team_id: str | None = None
    user_id: str | None = None
    models: tuple[str, ...] = ()
    max_budget_nanousd: int | None = None
    budget_duration: str | None = None
    budget_duration_s: int | None = None
    budget_anchor_s: int | None = None
    tpm_limit: int | None = None
    rpm_limit: int | None = None
    max_parallel_requests: int | None = None
    model_rpm_limit: Mapping[str, int] = attrs.Factory(dict)
    model_tpm_limit: Mapping[str, int] = attrs.Factory(dict)
    metadata: Mapping[str, Any] = attrs.Factory(dict)
    tags: tuple[str, ...] = ()
    expires_at_ms: int | None = None
    blocked: bool = False
    created_at_ms: int = 0
    updated_at_ms: int = 0
    aliases: Mapping[str, str] = attrs.Factory(dict)
    budget_id: str | None = None
    soft_budget_nanousd: int | None = None
    model_max_budget: Mapping[str, Any] = attrs.Factory(dict)
    secret_hash: str | None = None
    previous_secret_hash: str | None = None
    previous_secret_expires_at_ms: int | None = None
    auto_rotate: bool | None = None
    rotation_interval: str | None = None
    key_rotation_at_ms: int | None = None
    last_rotation_at_ms: int | None = None
    rotation_count: int | None = None

    @property
    def current_secret_hash(self) -> str:
        """The SHA-256 of the secret that authenticates as this key now."""
        return self.secret_hash or self.token_hash


@final
@attrs.frozen(kw_only=True)
class TeamRow:
    """A team: keys with a ``team_id`` share its budget and limits (fields as in KeyRow)."""

    team_id: str
    team_alias: str | None = None
    models: tuple[str, ...] = ()
    max_budget_nanousd: int | None = None
    budget_duration: str | None = None
    budget_duration_s: int | None = None
    budget_anchor_s: int | None = None
    tpm_limit: int | None = None
    rpm_limit: int | None = None
    max_parallel_requests: int | None = None
    metadata: Mapping[str, Any] = attrs.Factory(dict)
    blocked: bool = False
    created_at_ms: int = 0
    updated_at_ms: int = 0
    model_aliases: Mapping[str, str] = attrs.Factory(dict)
    budget_id: str | None = None
    soft_budget_nanousd: int | None = None
    model_max_budget: Mapping[str, Any] = attrs.Factory(dict)


@final
@attrs.frozen(kw_only=True)
class UserRow:
    """An internal user (LiteLLM's ``LiteLLM_UserTable``); fields as in KeyRow."""

    user_id: str
    user_email: str | None = None
    user_alias: str | None = None
    models: tuple[str, ...] = ()
    max_budget_nanousd: int | None = None
    budget_duration: str | None = None
    budget_duration_s: int | None = None
    budget_anchor_s: int | None = None
    tpm_limit: int | None = None
    rpm_limit: int | None = None
    max_parallel_requests: int | None = None
    metadata: Mapping[str, Any] = attrs.Factory(dict)
    blocked: bool = False
    created_at_ms: int = 0
    updated_at_ms: int = 0
    user_role: str | None = None
    budget_id: str | None = None
    soft_budget_nanousd: int | None = None


@final
@attrs.frozen(kw_only=True)
class EndUserRow:
    """An end user (LiteLLM's customer), named by the client per request; as KeyRow."""

    user_id: str
    alias: str | None = None
    max_budget_nanousd: int | None = None
    budget_duration: str | None = None
    budget_duration_s: int | None = None
    budget_anchor_s: int | None = None
    tpm_limit: int | None = None
    rpm_limit: int | None = None
    max_parallel_requests: int | None = None
    metadata: Mapping[str, Any] = attrs.Factory(dict)
    blocked: bool = False
    created_at_ms: int = 0
    updated_at_ms: int = 0
    budget_id: str | None = None
    soft_budget_nanousd: int | None = None


@final
@attrs.frozen(kw_only=True)
class TagRow:
    """A tag with its own budget and limits (requests carry tags); as KeyRow."""

    tag: str
    description: str | None = None
    max_budget_nanousd: int | None = None
    budget_duration: str | None = None
    budget_duration_s: int | None = None
    budget_anchor_s: int | None = None
    tpm_limit: int | None = None
    rpm_limit: int | None = None
    created_at_ms: int = 0
    updated_at_ms: int = 0


@final
@attrs.frozen(kw_only=True)
class BudgetRow:
    """A shared budget (LiteLLM's budget table); entities name it by ``budget_id``.

    Its limits apply to each principal that names it, counted per principal (as in
    LiteLLM: two end users on one budget each get the whole budget).
    """

    budget_id: str
    max_budget_nanousd: int | None = None
    budget_duration: str | None = None
    budget_duration_s: int | None = None
    budget_anchor_s: int | None = None
    tpm_limit: int | None = None
    rpm_limit: int | None = None
    max_parallel_requests: int | None = None
    created_at_ms: int = 0
    updated_at_ms: int = 0


@final
@attrs.frozen(kw_only=True)
class TeamMember:
    """One member of a team: ``role`` is ``"admin"`` (manages members and the team's
    keys) or ``"user"``. ``max_budget_nanousd`` (LiteLLM's ``max_budget_in_team``),
    ``tpm_limit`` and ``rpm_limit`` bound the member's requests through the team's keys
    (the budget per period of the team's ``budget_duration``)."""

    team_id: str
    user_id: str
    role: str
    user_email: str | None = None
    created_at_ms: int = 0
    max_budget_nanousd: int | None = None
    tpm_limit: int | None = None
    rpm_limit: int | None = None

    @property
    def limited(self) -> bool:
        """Whether the member has a budget or a rate limit of its own in the team."""
        return any(v is not None for v in (self.max_budget_nanousd, self.tpm_limit,
                                           self.rpm_limit))


@final
@attrs.frozen(kw_only=True)
class SpendLogRow:
    """One request, for reports. Written in batches by the spend-log writer.

    Attributes:
        request_id: the request's id (primary key: inserting it twice is a no-op).
        api: one of :data:`APIS`.
        key_hash: SHA-256 of the key (None for master-key requests).
        key_alias, team_id, user_id, end_user, tags: who the request was accounted to.
        model_group: the model name the client asked for.
        deployment_id, upstream_model: what served it.
        input_tokens, output_tokens: usage as reported (or estimated).
        cost_nanousd: cost in nano-USD (integer).
        cache_hit: answered from the response cache.
        status: one of :data:`STATUSES`.
        http_status: the status code sent to the client.
        latency_ms: end minus start.
        start_time_ms, end_time_ms: epoch ms.
        response_id: the response's own id as the upstream sent it (``chatcmpl-…``,
            ``msg_…``, ``resp_…``), when there was one.
        client_request_id: the client's own ``x-request-id``, when it sent one (the
            response then carries it; ``request_id`` stays the gateway's, unique).
        guardrails: the guardrails that ran, as a JSON list of ``{guardrail_name, mode,
            status, message}`` (None: none ran).
        metadata: LiteLLM's spend-log metadata (who was charged, the request's own
            ``metadata``), as JSON text.
        cache_key: the response-cache key of the request, when the cache was used.
        api_base: the answering deployment's base URL.
        messages, response: the request's messages and the answer, as JSON text (only
            with ``store_prompts_in_spend_logs``).
    """

    request_id: str
    api: str
    key_hash: str | None = None
    key_alias: str | None = None
    team_id: str | None = None
    user_id: str | None = None
    end_user: str | None = None
    tags: tuple[str, ...] = ()
    model_group: str | None = None
    deployment_id: str | None = None
    upstream_model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_nanousd: int = 0
    cache_hit: bool = False
    status: str = "success"
    http_status: int | None = None
    latency_ms: int = 0
    start_time_ms: int = 0
    end_time_ms: int = 0
    response_id: str | None = None
    client_request_id: str | None = None
    guardrails: str | None = None
    metadata: str | None = None
    cache_key: str | None = None
    api_base: str | None = None
    messages: str | None = None
    response: str | None = None


@final
@attrs.frozen(kw_only=True)
class SpendTotals:
    """Sums over the spend logs that match a filter (integers: exact)."""

    requests: int
    input_tokens: int
    output_tokens: int
    cost_nanousd: int


@final
@attrs.frozen(kw_only=True)
class DailySpend:
    """Spend of one group (key hash, team id, ...) on one UTC day.

    Attributes:
        day: ``"YYYY-MM-DD"`` (UTC) of ``start_time_ms``.
        group_id: the key hash, team id, user id or end user (None for rows without one).
    """

    day: str
    group_id: str | None
    requests: int
    input_tokens: int
    output_tokens: int
    cost_nanousd: int
