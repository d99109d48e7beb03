"""Rows → :class:`~triogate.governance.principals.Principal`: what governance checks.

The store imports the governance *records* only (no logic), so identity resolution can
turn rows fetched from SQL into principals without knowing column names. A row without
a budget anchor (never the case for rows this store wrote) anchors its periods at 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.governance.principals import Limits, Principal
from triogate.store.records import parse_duration

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from triogate.store.records import (
        EndUserRow,
        KeyRow,
        TagRow,
        TeamMember,
        TeamRow,
        UserRow,
    )


def _limits(
    row: KeyRow | TeamRow | UserRow | EndUserRow | TagRow, *, max_parallel: int | None
) -> Limits:
    return Limits(
        max_budget_nanousd=row.max_budget_nanousd,
        budget_duration_s=row.budget_duration_s,
        budget_anchor_s=row.budget_anchor_s or 0,
        rpm=row.rpm_limit,
        tpm=row.tpm_limit,
        max_parallel=max_parallel,
    )


def model_budgets(raw: Mapping[str, Any], anchor_s: int | None) -> dict[str, Limits]:
    """``model_max_budget`` as stored → model group → its own budget's limits (periods
    count from the owner's anchor). Entries the store could not have written are left out."""
    out = {}
    for group, entry in raw.items():
        cap = entry.get("budget_limit_nanousd") if isinstance(entry, dict) else None
        if not isinstance(cap, int):
            continue
        period = entry.get("time_period")
        out[group] = Limits(max_budget_nanousd=cap, budget_anchor_s=anchor_s or 0,
                            budget_duration_s=parse_duration(period) if period else None)
    return out


def guardrail_settings(metadata: Mapping[str, Any] | None
                       ) -> dict[str, Any]:
    """A key's or team's guardrail settings from its metadata, where LiteLLM keeps them
    (``guardrails``, ``disable_global_guardrails``): Principal fields. What the admin
    API could not have written (a name that is not a string, a flag that is not a
    boolean) is left out."""
    meta = metadata or {}
    names = meta.get("guardrails")
    off = meta.get("disable_global_guardrails")
    return {
        "guardrails": tuple(dict.fromkeys(n for n in names if isinstance(n, str)))
        if isinstance(names, list) else (),
        "disable_global_guardrails": off if isinstance(off, bool) else None,
    }


def key_principal(row: KeyRow) -> Principal:
    """A key: id = its SHA-256, with per-model limits and expiry."""
    return Principal(
        kind="key",
        id=row.token_hash,
        limits=_limits(row, max_parallel=row.max_parallel_requests),
        models=row.models,
        blocked=row.blocked,
        expires_ms=row.expires_at_ms,
        model_rpm=dict(row.model_rpm_limit),
        model_tpm=dict(row.model_tpm_limit),
        alias=row.key_alias,
        aliases=dict(row.aliases),
        soft_budget_nanousd=row.soft_budget_nanousd,
        model_budgets=model_budgets(row.model_max_budget, row.budget_anchor_s),
        **guardrail_settings(row.metadata),
    )


def team_principal(row: TeamRow) -> Principal:
    """A team."""
    return Principal(
        kind="team",
        id=row.team_id,
        limits=_limits(row, max_parallel=row.max_parallel_requests),
        models=row.models,
        blocked=row.blocked,
        alias=row.team_alias,
        aliases=dict(row.model_aliases),
        soft_budget_nanousd=row.soft_budget_nanousd,
        model_budgets=model_budgets(row.model_max_budget, row.budget_anchor_s),
        **guardrail_settings(row.metadata),
    )


def user_principal(row: UserRow) -> Principal:
    """An internal user (alias: its alias, else its email)."""
    return Principal(
        kind="user",
        id=row.user_id,
        limits=_limits(row, max_parallel=row.max_parallel_requests),
        models=row.models,
        blocked=row.blocked,
        alias=row.user_alias or row.user_email,
        role=row.user_role,
        soft_budget_nanousd=row.soft_budget_nanousd,
    )


def end_user_principal(row: EndUserRow) -> Principal:
    """An end user (LiteLLM's customer): no model list of its own."""
    return Principal(
        kind="end_user",
        id=row.user_id,
        limits=_limits(row, max_parallel=row.max_parallel_requests),
        blocked=row.blocked,
        alias=row.alias,
        soft_budget_nanousd=row.soft_budget_nanousd,
    )


def tag_principal(row: TagRow) -> Principal:
    """A tag: budget and rate limits only."""
    return Principal(kind="tag", id=row.tag, limits=_limits(row, max_parallel=None))


def member_principal(member: TeamMember, team: TeamRow) -> Principal:
    """A user's membership of a team, as far as its own limits inside the team go
    (``max_budget_in_team``): its budget periods are the team's."""
    return Principal(
        kind="team_member",
        id=f"{member.team_id}:{member.user_id}",
        limits=Limits(
            max_budget_nanousd=member.max_budget_nanousd,
            budget_duration_s=team.budget_duration_s,
            budget_anchor_s=team.budget_anchor_s or 0,
            rpm=member.rpm_limit,
            tpm=member.tpm_limit,
        ),
        alias=f"{member.user_id} in team {team.team_alias or team.team_id}",
    )
