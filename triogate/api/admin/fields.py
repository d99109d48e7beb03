"""Admin request bodies in, admin response bodies out: LiteLLM's field names, exact money.

Pure and synchronous (no I/O), so every rule here is unit-tested without a gateway.

**In.** Each entity has a table of the body fields it accepts, keyed by LiteLLM's name,
each with a converter to the store's record fields (``max_budget`` in USD becomes
``max_budget_nanousd``; ``duration`` becomes ``expires_at_ms``). A field outside the
table is a 400 naming it: a typo fails loudly instead of being ignored. A wrong type
or value is a 400 naming the field. ``null`` clears a field on update (a budget, a
limit, an alias) or resets it to its default (``models``, ``metadata``, ``tags``,
``blocked``).

**Money** arrives in USD, as a number or a numeric string, and is converted exactly:
``Decimal(str(x))`` scaled to integer nano-USD (rounded half-up below a nano-dollar), so
``0.1`` is 100,000,000 nano-USD, never 99,999,999.

**Out.** Rows become LiteLLM-shaped dicts: ``token`` is the key's SHA-256, ``key_name``
(and ``key_hint``) its ``"sk-...abcd"`` hint, ``max_budget`` is USD (a float, with the
exact ``max_budget_nanousd`` next to it), times are ISO 8601 UTC strings with the
epoch-ms value alongside. The raw key is never part of a rendered row.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import attrs

from triogate.api.admin import compat, guardrail_fields
from triogate.api.admin.bounds import (
    MAX_ITEMS,
    MAX_PAGE,
    bad,
    check_duration_s,
    check_json,
    check_text,
    check_time_ms,
    json_depth_ok,
)
from triogate.api.admin.converters import Converter, FieldContext
from triogate.api.errors import ApiError
from triogate.store.records import hash_key, parse_duration

if TYPE_CHECKING:
    from triogate.governance.budgets import BudgetState

NANOUSD_PER_USD = 1_000_000_000
#: Largest integer a BIGINT column holds: money (nano-USD) and limits stay below it.
MAX_BIGINT = 2**63 - 1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


_NO_CONTEXT = FieldContext(groups=frozenset(), now_ms=0)


# --------------------------------------------------------------------------- converters


def text(column: str) -> Converter:
    """A string (or null) stored as ``column``."""

    def convert(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
        if value is not None and not isinstance(value, str):
            raise bad(name, "must be a string")
        return {column: None if value is None else check_text(name, value)}

    return convert


def usd_to_nanousd(name: str, value: Any) -> int:
    """USD (number or numeric string) → integer nano-USD, exactly (half-up below 1 nano).

    Raises:
        ApiError: not a finite, non-negative number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise bad(name, "must be a number of USD (e.g. 10 or \"0.5\")")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise bad(name, f"must be a number of USD, not {value!r}") from None
    if not amount.is_finite():
        raise bad(name, "must be a finite number of USD")
    if amount < 0:
        raise bad(name, "must not be negative")
    nanousd = int((amount * NANOUSD_PER_USD).to_integral_value(rounding=ROUND_HALF_UP))
    if nanousd > MAX_BIGINT:
        raise bad(name, f"must be at most {MAX_BIGINT // NANOUSD_PER_USD} USD")
    return nanousd


def _max_budget(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    return {"max_budget_nanousd": None if value is None else usd_to_nanousd(name, value)}


def _budget_duration(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    if value is not None:
        seconds(name, value)
    return {"budget_duration": value}


def _soft_budget(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    return {"soft_budget_nanousd": None if value is None else usd_to_nanousd(name, value)}


def _model_max_budget(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    """LiteLLM's ``{"gpt-4o": {"budget_limit": 10, "time_period": "1d"}}``: a budget per
    model group, stored in nano-USD (``time_period`` null: one period for ever)."""
    if value is None:
        return {"model_max_budget": {}}
    if not isinstance(value, dict):
        raise bad(name, 'must be an object like {"gpt-4o": {"budget_limit": 10, '
                        '"time_period": "1d"}}')
    _check_names(name, list(value))
    out: dict[str, Any] = {}
    for group, entry in value.items():
        if not isinstance(entry, dict) or "budget_limit" not in entry or (
                set(entry) - {"budget_limit", "time_period"}):
            raise bad(f"{name}.{group}", "must be an object with budget_limit (USD) and "
                                         "an optional time_period (e.g. \"1d\")")
        period = entry.get("time_period")
        if period is not None:
            seconds(f"{name}.{group}.time_period", period)
        out[group] = {"budget_limit_nanousd": usd_to_nanousd(f"{name}.{group}.budget_limit",
                                                             entry["budget_limit"]),
                      "time_period": period}
    return {"model_max_budget": out}


def seconds(name: str, value: Any) -> int:
    """A LiteLLM duration (``"30d"``) in seconds, at most 100 years."""
    try:
        return check_duration_s(name, parse_duration(value))
    except ValueError as exc:
        raise bad(name, f"is invalid: {exc}") from None


def count(column: str) -> Converter:
    """A non-negative integer (or null) stored as ``column``."""

    def convert(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BIGINT
        ):
            raise bad(name, "must be a non-negative integer (below 2**63)")
        return {column: value}

    return convert


def _check_names(name: str, names: list[str]) -> None:
    """Model names: stored as given (wildcards, ``all-team-models``, groups configured
    later); only their size is bounded."""
    if len(names) > MAX_ITEMS:
        raise bad(name, f"must not name more than {MAX_ITEMS} models")
    for model in names:
        if not model:
            raise bad(name, "must not contain an empty model name")
        check_text(name, model, max_chars=256)


def _models(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    if value is None:
        return {"models": ()}
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad(name, "must be a list of model group names")
    _check_names(name, value)
    return {"models": tuple(dict.fromkeys(value))}


def model_limits(column: str) -> Converter:
    """``{model group: non-negative int}`` (or null = none) stored as ``column``."""

    def convert(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
        if value is None:
            return {column: {}}
        if not isinstance(value, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_BIGINT
            for v in value.values()
        ):
            raise bad(name, "must be an object mapping model groups to non-negative integers")
        _check_names(name, list(value))
        return {column: dict(value)}

    return convert


def _metadata(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    if value is not None and not isinstance(value, dict):
        raise bad(name, "must be an object")
    check_json(name, value or {})
    return {"metadata": dict(value or {})}


def _tags(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    if value is None:
        return {"tags": ()}
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise bad(name, "must be a list of non-empty strings")
    if len(value) > MAX_ITEMS:
        raise bad(name, f"must not hold more than {MAX_ITEMS} tags")
    for tag in value:
        check_text(name, tag, max_chars=256)
    return {"tags": tuple(dict.fromkeys(value))}


def _auto_rotate(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    if value is not None and not isinstance(value, bool):
        raise bad(name, "must be a boolean")
    return {"auto_rotate": bool(value)}


def _rotation_interval(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    if value is not None and seconds(name, value) < 60:
        raise bad(name, "must be at least 60s")
    return {"rotation_interval": value}


def _blocked(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    if value is not None and not isinstance(value, bool):
        raise bad(name, "must be a boolean")
    return {"blocked": bool(value)}


def _duration(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    """Key lifetime from now (``"30d"``); null = never expires."""
    if value is None:
        return {"expires_at_ms": None}
    return {"expires_at_ms": check_time_ms(name, ctx.now_ms + seconds(name, value) * 1000)}


def parse_time_ms(name: str, value: Any) -> int:
    """An ISO 8601 date/datetime (naive = UTC) or epoch milliseconds → epoch ms, between
    1970 and the year 9999."""
    if isinstance(value, int) and not isinstance(value, bool):
        return check_time_ms(name, value)
    if (isinstance(value, str) and len(value) < 64 and value.isascii()
            and value.strip().lstrip("-").isdigit()):
        return check_time_ms(name, int(value.strip()))
    if not isinstance(value, str) or len(value) > 64:
        raise bad(name, "must be an ISO 8601 date or datetime, or epoch milliseconds")
    try:
        moment = datetime.fromisoformat(value.strip())
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        epoch_ms = math.floor(moment.timestamp() * 1000)
    except (ValueError, OverflowError):
        raise bad(name, f"is not an ISO 8601 date or datetime: {value[:64]!r}") from None
    return check_time_ms(name, epoch_ms)


def _expires(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    return {"expires_at_ms": None if value is None else parse_time_ms(name, value)}


def aliases(column: str) -> Converter:
    """``{requested model: model group}`` (or null = none) stored as ``column``."""

    def convert(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
        if value is None:
            return {column: {}}
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
        ):
            raise bad(name, "must be an object mapping model names to model group names")
        _check_names(name, [*value, *value.values()])
        return {column: dict(value)}

    return convert


#: LiteLLM's user roles (``proxy_admin`` ... ``internal_user_viewer``); see api/roles.py.
USER_ROLES = ("proxy_admin", "proxy_admin_viewer", "internal_user", "internal_user_viewer")


def _user_role(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    if value is not None and value not in USER_ROLES:
        raise bad(name, f"must be one of {', '.join(USER_ROLES)} (or null)")
    return {"user_role": value}


_LIMITS: dict[str, Converter] = {
    "max_budget": _max_budget,
    "budget_duration": _budget_duration,
    "tpm_limit": count("tpm_limit"),
    "rpm_limit": count("rpm_limit"),
}
#: A budget's limits (``/budget/new``), which every principal also has.
LIMIT_FIELDS: Mapping[str, Converter] = {
    **_LIMITS, "max_parallel_requests": count("max_parallel_requests")}
_PRINCIPAL: dict[str, Converter] = {
    **LIMIT_FIELDS,
    "metadata": _metadata,
    "blocked": _blocked,
    "budget_id": text("budget_id"),
    "soft_budget": _soft_budget,
}

#: A key's or team's guardrails, kept in its metadata (``guardrail_fields.fold``).
_GUARDRAILS: dict[str, Converter] = {
    "guardrails": guardrail_fields.guardrails_field,
    "disable_global_guardrails": guardrail_fields.disable_field,
}

#: Body fields per entity (ids and request-only fields are handled by the handlers):
#: LiteLLM's names, implemented ones and accepted-as-no-op ones (``compat.py``).
KEY_FIELDS: Mapping[str, Converter] = compat.table({
    **_PRINCIPAL,
    "key_alias": text("key_alias"),
    "team_id": text("team_id"),
    "user_id": text("user_id"),
    "models": _models,
    "aliases": aliases("aliases"),
    "model_rpm_limit": model_limits("model_rpm_limit"),
    "model_tpm_limit": model_limits("model_tpm_limit"),
    "model_max_budget": _model_max_budget,
    "tags": _tags,
    "duration": _duration,
    "expires": _expires,
    "auto_rotate": _auto_rotate,
    "rotation_interval": _rotation_interval,
    **_GUARDRAILS,
}, compat.KEY_NOOP)
TEAM_FIELDS: Mapping[str, Converter] = compat.table({
    **_PRINCIPAL, "team_alias": text("team_alias"), "models": _models,
    "model_aliases": aliases("model_aliases"),
    "model_max_budget": _model_max_budget,
    **_GUARDRAILS,
}, compat.TEAM_NOOP)
USER_FIELDS: Mapping[str, Converter] = compat.table({
    **_PRINCIPAL,
    "user_email": text("user_email"),
    "user_alias": text("user_alias"),
    "models": _models,
    "user_role": _user_role,
}, compat.USER_NOOP)
END_USER_FIELDS: Mapping[str, Converter] = compat.table(
    {**_PRINCIPAL, "alias": text("alias")}, compat.END_USER_NOOP)
TAG_FIELDS: Mapping[str, Converter] = {**_LIMITS, "description": text("description")}


def parse_fields(
    body: Mapping[str, Any],
    fields: Mapping[str, Converter],
    ctx: FieldContext,
    *,
    extra: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The store fields for ``body``.

    Args:
        body: the JSON body.
        fields: the entity's table (e.g. :data:`KEY_FIELDS`).
        ctx: groups and clock.
        extra: body fields the handler reads itself (ids, ``auto_create_key``): allowed
            here, not converted.

    Raises:
        ApiError: 400 for an unknown field, a wrong type or value, or ``duration`` and
            ``expires`` together.
    """
    for name in body:
        if name not in fields and name not in extra:
            accepted = ", ".join(sorted({*fields, *extra}))
            raise ApiError(400, f"unknown field '{name}' (accepted: {accepted})",
                           "invalid_request_error", param=name)
    if "duration" in body and "expires" in body:
        raise bad("expires", "cannot be given together with 'duration'")
    out: dict[str, Any] = {}
    for name, value in body.items():
        if name in fields:
            out.update(fields[name](name, value, ctx))
    return out


def only(body: Mapping[str, Any], *allowed: str) -> None:
    """400 for a field of ``body`` outside ``allowed`` (bodies without settable fields)."""
    parse_fields(body, {}, _NO_CONTEXT, extra=frozenset(allowed))


def required_str(body: Mapping[str, Any], name: str) -> str:
    """``body[name]``, which must be a non-empty string."""
    value = body.get(name)
    if value is None:
        raise ApiError(400, f"missing required field '{name}'", param=name)
    if not isinstance(value, str) or not value:
        raise bad(name, "must be a non-empty string")
    return check_text(name, value)


def str_list(body: Mapping[str, Any], name: str) -> list[str]:
    """``body[name]``, which must be a non-empty list of non-empty strings."""
    value = body.get(name)
    if value is None:
        raise ApiError(400, f"missing required field '{name}'", param=name)
    if not isinstance(value, list) or not value or not all(
        isinstance(v, str) and v for v in value
    ):
        raise bad(name, "must be a non-empty list of non-empty strings")
    if len(value) > MAX_ITEMS:
        raise bad(name, f"must not hold more than {MAX_ITEMS} entries")
    for item in value:
        check_text(name, item)
    return value


def key_candidates(value: str) -> list[str]:
    """The hashes a key reference may mean: a 64-hex string may already be the hash."""
    hashed = hash_key(value)
    return [value, hashed] if _HEX64.match(value) else [hashed]


# --------------------------------------------------------------------------- rendering


def usd(nanousd: int | None) -> float | None:
    """Nano-USD as a USD float (display only; the exact value is rendered next to it)."""
    return None if nanousd is None else float(Decimal(nanousd).scaleb(-9))


def iso(epoch_ms: int | None) -> str | None:
    """Epoch ms as ``2025-01-31T12:00:00.000Z``."""
    if epoch_ms is None:
        return None
    try:
        moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError):  # a row stored before the bounds existed
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


#: Record fields never rendered: internal period bookkeeping.
_HIDDEN = frozenset({"budget_duration_s", "budget_anchor_s", "secret_hash",
                     "previous_secret_hash"})


def render_row(row: Any) -> dict[str, Any]:
    """A store record (key, team, user, end user, tag) as a LiteLLM-shaped dict."""
    out: dict[str, Any] = {}
    for name, value in attrs.asdict(row, recurse=False).items():
        if name in _HIDDEN:
            continue
        if name == "token_hash":
            out["token"] = out["token_id"] = value
        elif name == "key_hint":
            out["key_name"] = out["key_hint"] = value
        elif name == "tag":
            out["name"] = value
        elif name == "max_budget_nanousd":
            out["max_budget"] = usd(value)
            out["max_budget_nanousd"] = value
        elif name == "soft_budget_nanousd":
            out["soft_budget"] = usd(value)
            out[name] = value
        elif name == "model_max_budget":
            out[name] = {g: {"budget_limit": usd(e.get("budget_limit_nanousd")),
                             "time_period": e.get("time_period")}
                         for g, e in value.items() if isinstance(e, dict)}
        elif name == "expires_at_ms":
            out["expires"] = iso(value)
            out["expires_at_ms"] = value
        elif name.endswith("_at_ms"):  # created_at, key_rotation_at ...
            out[name.removesuffix("_ms")] = iso(value)
            out[name] = value
        elif isinstance(value, tuple):
            out[name] = list(value)
        elif isinstance(value, Mapping):
            out[name] = dict(value) if json_depth_ok(value) else {"unrenderable": True}
        else:
            out[name] = value
    return out


def render_member(member: Any) -> dict[str, Any]:
    """A team member as LiteLLM's ``members_with_roles`` entry, with its limits inside
    the team (``max_budget_in_team``, and LiteLLM's ``litellm_budget_table``)."""
    budget = getattr(member, "max_budget_nanousd", None)
    limits = {"max_budget": usd(budget), "tpm_limit": getattr(member, "tpm_limit", None),
              "rpm_limit": getattr(member, "rpm_limit", None)}
    return {"user_id": member.user_id, "user_email": member.user_email, "role": member.role,
            "max_budget_in_team": usd(budget), "max_budget_in_team_nanousd": budget,
            "litellm_budget_table": limits if any(v is not None for v in limits.values())
            else None}


def render_budget(state: BudgetState | None) -> dict[str, Any]:
    """This period's spend as info endpoints show it (nulls when Redis did not answer)."""
    if state is None:
        return {"spend": None, "spend_nanousd": None, "reserved_nanousd": None,
                "budget_reset_at": None}
    return {
        "spend": usd(state.spend_nanousd),
        "spend_nanousd": state.spend_nanousd,
        "reserved_nanousd": state.reserved_nanousd,
        "budget_reset_at": iso(state.period_end_ms),
    }


def paging(query: Mapping[str, str], *, default_size: int = 100, max_size: int = 1000
           ) -> tuple[int, int]:
    """``page`` (from 1) and ``size`` (or LiteLLM's ``page_size``) from a query string."""
    values = []
    for name, default, upper in (("page", 1, None), ("size", default_size, max_size)):
        raw = query.get(name, query.get("page_size") if name == "size" else None)
        if raw is None or raw == "":
            values.append(default)
            continue
        upper = upper or MAX_PAGE
        if len(raw) > 9 or not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= upper:
            limit = f"1..{upper}"
            raise ApiError(400, f"query parameter '{name}' must be an integer in {limit}",
                           param=name)
        values.append(int(raw))
    return values[0], values[1]


def page_count(total: int, size: int) -> int:
    """Pages needed for ``total`` items (at least 1, as LiteLLM reports it)."""
    return max(1, -(-total // size))
