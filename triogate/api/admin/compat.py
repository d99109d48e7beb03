"""LiteLLM's admin fields that triogate accepts without acting on them, and why.

A LiteLLM admin script sends many fields, most of them null or empty
(``"aliases": {}``, ``"allowed_model_region": null``, ``"spend": 0``). Each such field is
**accepted when its value asks for nothing** (null, false, 0, empty string, list or
object, or the field's documented default) and **refused by name** (400) when the value
asks for behaviour triogate does not have, so a script never believes it set something
that is silently ignored.

Fields that name whole features triogate leaves out (organizations, SSO and UI login,
guardrails per user or customer) say so in their refusal. The implemented fields live in
``fields.py``; the migration table in docs/migrating-from-litellm.md is rendered from
both (:func:`field_table`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api.admin.bounds import bad

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.admin.converters import Converter, FieldContext

#: Values that ask for nothing, whatever the field.
_EMPTY: tuple[Any, ...] = (None, False, 0, "", [], {})

_ORGS = "organizations, which triogate does not have (keys, teams and users only)"
_SSO = "SSO / UI login, which triogate does not have (the admin API uses keys)"
_GUARDRAILS = ("guardrails per user or customer (set guardrails on the key or its team: "
               "/key/update, /team/update)")


class Noop:
    """A converter that accepts only values asking for nothing (it stores nothing).

    Attributes:
        reason: what the field would ask for, for the refusal and the migration table.
        defaults: further values accepted as "nothing" (e.g. ``"default"``).
    """

    def __init__(self, reason: str, *defaults: Any) -> None:
        self.reason = reason
        self.defaults = defaults

    def __call__(self, name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
        if any(value == d and type(value) is type(d) for d in (*_EMPTY, *self.defaults)):
            return {}
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
            return {}
        raise bad(name, f"asks for {self.reason}; triogate accepts it only when null or "
                        "empty (see docs/migrating-from-litellm.md)")


def _n(reason: str, *defaults: Any) -> Noop:
    return Noop(reason, *defaults)


_SPEND = _n("setting spend by hand (spend is counted from requests)")
_SOFT = _n("soft budgets on shared budgets (set soft_budget on the key, team, user or "
           "customer)")
_MODEL_BUDGET = _n("per-model budgets here (set model_max_budget on the key or team)")
_CACHE_CONTROLS = _n("per-key cache-control restrictions")
_PERMS = _n("per-key permissions / object permissions")
_ROUTES = _n("per-key route restrictions")
_VECTOR = _n("vector stores, which triogate does not serve")
_PROMPTS = _n("prompt management, which triogate does not have")
_INVITE = _n("invitation e-mails, which triogate does not send")
_CONFIG = _n("key-specific config overrides")
_ACCESS_GROUPS = _n("access groups stored by id; name the config's access groups "
                    "(model_info.access_groups) in 'models' instead")
_ROUTER = _n("per-key router settings")
_ENFORCED = _n("enforced request parameters")
_TEMP_BUDGET = _n("temporary budget increases")
_REGION = _n("model regions (allowed_model_region)")
_DEFAULT_MODEL = _n("a default model for an end user")
_LIMIT_TYPE = _n("rate-limit priority types", "default")
_TEAM_MEMBER = _n("per-member limits inside a team")

#: Fields of LiteLLM's newer key and user bodies (``GenerateRequestBase``).
_NEWER: dict[str, Converter] = {
    "agent_id": _n("agents, which triogate does not have"),
    "budget_limits": _n("several budget windows at once (one budget_duration each here)"),
    "budget_fallbacks": _n("budget fallbacks (models to use once a budget is spent)"),
    "mcp_rpm_limit": _n("MCP servers, which triogate does not serve"),
    "tag_rpm_limit": _n("per-tag limits on a key (give the tag its own limits: /tag/new)"),
}

#: Fields every principal-like entity may carry, as no-ops.
_COMMON: dict[str, Converter] = {
    "spend": _SPEND,
    "soft_budget": _SOFT,
    "model_max_budget": _MODEL_BUDGET,
    "object_permission": _PERMS,
    "organization_id": _n(_ORGS),
    "guardrails": _n(_GUARDRAILS),
    "budget_reset_at": _n("setting the budget reset time (periods count from creation)"),
}

#: /budget/new and /budget/update fields beyond the limits.
BUDGET_NOOP: dict[str, Converter] = {
    "soft_budget": _SOFT,
    "model_max_budget": _MODEL_BUDGET,
    "budget_reset_at": _COMMON["budget_reset_at"],
}

KEY_NOOP: dict[str, Converter] = {
    **_COMMON,
    **_NEWER,
    "policies": _n("policies"),
    "config": _CONFIG,
    "send_invite_email": _INVITE,
    "permissions": _PERMS,
    "allowed_cache_controls": _CACHE_CONTROLS,
    "enforced_params": _ENFORCED,
    "allowed_routes": _ROUTES,
    "allowed_passthrough_routes": _ROUTES,
    "prompts": _PROMPTS,
    "rpm_limit_type": _LIMIT_TYPE,
    "tpm_limit_type": _LIMIT_TYPE,
    "key_type": _n("key types (llm_api / management / read_only)", "default"),
    "allowed_vector_store_indexes": _VECTOR,
    "router_settings": _ROUTER,
    "access_group_ids": _ACCESS_GROUPS,
    "temp_budget_increase": _TEMP_BUDGET,
    "temp_budget_expiry": _TEMP_BUDGET,
    "allowed_model_region": _REGION,
    "user_email": _n("e-mails on keys (set user_email on the user)"),
}

TEAM_NOOP: dict[str, Converter] = {
    **_COMMON,
    "admins": _n("the old admins list; use members_with_roles"),
    "members_with_roles": _n("changing members here; use /team/member_add and "
                             "/team/member_delete (accepted on /team/new)"),
    "members": _n("the old members list; use members_with_roles"),
    "team_member_permissions": _PERMS,
    "team_member_budget": _TEAM_MEMBER,
    "team_member_rpm_limit": _TEAM_MEMBER,
    "team_member_tpm_limit": _TEAM_MEMBER,
    "team_member_key_duration": _TEAM_MEMBER,
    "model_rpm_limit": _n("per-model limits on a team (set them on its keys)"),
    "model_tpm_limit": _n("per-model limits on a team (set them on its keys)"),
    "tags": _n("team tags (set tags on its keys)"),
    "allowed_vector_store_indexes": _VECTOR,
    "prompts": _PROMPTS,
    "allowed_passthrough_routes": _ROUTES,
    "router_settings": _ROUTER,
    "access_group_ids": _ACCESS_GROUPS,
    "secret_manager_settings": _n("secret managers"),
    "policies": _n("policies"),
    "allowed_model_region": _REGION,
    "model_id": _n("team-owned model deployments"),
}

USER_NOOP: dict[str, Converter] = {
    **_COMMON,
    **_NEWER,
    "policies": _n("policies"),
    "send_invite_email": _INVITE,
    "password": _n(_SSO),
    "sso_user_id": _n(_SSO),
    "organizations": _n(_ORGS),
    "aliases": _n("model aliases on a user (set them on its keys)"),
    "config": _CONFIG,
    "allowed_cache_controls": _CACHE_CONTROLS,
    "permissions": _PERMS,
    "model_rpm_limit": _n("per-model limits on a user (set them on its keys)"),
    "model_tpm_limit": _n("per-model limits on a user (set them on its keys)"),
    "prompts": _PROMPTS,
    "teams": _n("adding a user to teams here; use /team/member_add"),
    "team_id": _n("adding a user to a team here; use /team/member_add"),
    "tags": _n("user tags (set tags on its keys)"),
}

END_USER_NOOP: dict[str, Converter] = {
    **_COMMON,
    **_NEWER,
    "policies": _n("policies"),
    "allowed_model_region": _REGION,
    "default_model": _DEFAULT_MODEL,
}


def table(implemented: Mapping[str, Converter], noop: Mapping[str, Converter]
          ) -> dict[str, Converter]:
    """An entity's full table: the implemented converters win over no-ops."""
    return {**noop, **implemented}


def field_table(name: str, fields: Mapping[str, Converter]) -> list[tuple[str, str, str]]:
    """``(field, status, note)`` rows for the migration table: implemented or accepted as no-op."""
    rows = []
    for field in sorted(fields):
        conv = fields[field]
        if isinstance(conv, Noop):
            rows.append((field, "no-op (null/empty only)", conv.reason))
        else:
            rows.append((field, "implemented", ""))
    return rows
