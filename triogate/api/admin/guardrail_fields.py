"""A key's or team's guardrails over the admin API, kept where LiteLLM keeps them.

LiteLLM stores ``guardrails`` (names of the config's guardrails) and
``disable_global_guardrails`` in the entity's ``metadata``, and takes them either as
top-level body fields or inside ``metadata`` (its dashboard sends the latter). Both land
in ``metadata`` here too, so the key's and team's rows, and the identity cache that
holds them, carry them with no schema change and no further read per request.

The converters below only check types; :func:`fold` moves the values into ``metadata``
once the handler knows the row being changed (an update keeps the rest of the
metadata), checks every name against the configured guardrails and applies LiteLLM's
permission rule: only a proxy admin may turn the default-on guardrails off
(``disable_global_guardrails: true``), unless the row already had it on.
Pure and synchronous.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api.admin.bounds import MAX_ITEMS, bad
from triogate.api.errors import ApiError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.admin.converters import FieldContext
    from triogate.api.services import Services

GUARDRAILS = "guardrails"
DISABLE = "disable_global_guardrails"
#: LiteLLM's per-default-on-guardrail opt-out list: not implemented, refused by name.
OPTED_OUT = "opted_out_global_guardrails"
#: Parsed-field names of the two body fields until :func:`fold` moves them into metadata.
_PENDING_NAMES, _PENDING_OFF = "_guardrails", "_disable_global_guardrails"


def _names(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise bad(name, "must be a list of guardrail names (guardrail_name in the config's "
                        "guardrails:)")
    if len(value) > MAX_ITEMS:
        raise bad(name, f"must not hold more than {MAX_ITEMS} names")
    return list(dict.fromkeys(value))


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad(name, "must be true or false")
    return value


def guardrails_field(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    """``guardrails``: names (null or [] = none of its own)."""
    return {_PENDING_NAMES: None if value is None else _names(name, value)}


def disable_field(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    """``disable_global_guardrails``: true, false, or null (not set: the team decides)."""
    return {_PENDING_OFF: None if value is None else _flag(name, value)}


def configured(services: Services) -> frozenset[str]:
    """The names of the config's guardrails."""
    guards = services.guardrails
    return frozenset(g.name for g in guards.specs) if guards is not None else frozenset()


def fold(fields: dict[str, Any], current: Mapping[str, Any] | None, *,
         configured: frozenset[str], admin: bool, entity: str) -> dict[str, Any]:
    """``fields`` with the guardrail settings moved into ``metadata`` and checked.

    Args:
        fields: the parsed body fields.
        current: the metadata of the row being changed (None when creating one).
        configured: the names of the config's guardrails.
        admin: whether the caller is a proxy admin.
        entity: ``key`` or ``team``, for messages.

    Raises:
        ApiError: 400 for an unknown guardrail name, a wrong type, or
            ``opted_out_global_guardrails``; 403 when a caller who is not a proxy admin
            turns the default-on guardrails off.
    """
    names = fields.pop(_PENDING_NAMES, ...)
    off = fields.pop(_PENDING_OFF, ...)
    if "metadata" not in fields and names is ... and off is ...:
        return fields
    meta = dict(fields.get("metadata", current or {}))
    for key, value in ((GUARDRAILS, names), (DISABLE, off)):
        if value is not ...:
            meta[key] = value
        if meta.get(key, ...) in (None, []):  # asks for nothing: nothing is kept
            del meta[key]
    check(meta, configured=configured, where="metadata." if "metadata" in fields else "")
    if (meta.get(DISABLE) is True and not admin
            and (current or {}).get(DISABLE) is not True):
        raise ApiError(403, f"only proxy admins may set '{DISABLE}' on a {entity}",
                       "permission_error", param=DISABLE)
    return {**fields, "metadata": meta}


def check(meta: Mapping[str, Any], *, configured: frozenset[str], where: str = "") -> None:
    """400 unless ``meta``'s guardrail settings are ones triogate acts on."""
    if meta.get(OPTED_OUT):
        raise bad(OPTED_OUT, "asks to skip chosen default-on guardrails, which triogate "
                             f"does not do; set '{DISABLE}' to skip them all")
    if GUARDRAILS in meta:
        for n in _names(f"{where}{GUARDRAILS}", meta[GUARDRAILS]):
            if n not in configured:
                raise ApiError(
                    400, f"unknown guardrail '{n}' (configured: "
                    f"{', '.join(sorted(configured)) or 'none'})",
                    "invalid_request_error", param=GUARDRAILS)
    if DISABLE in meta:
        _flag(f"{where}{DISABLE}", meta[DISABLE])
