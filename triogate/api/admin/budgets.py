"""``/budget/*``: LiteLLM's budget table, and ``budget_id`` on keys, teams, users and
customers (end users).

A budget is a named set of limits: ``max_budget``, ``budget_duration``, ``tpm_limit``,
``rpm_limit``, ``max_parallel_requests``. A key, team, user or end user whose
``budget_id`` names it is governed by those limits, **each counted on its own** (two
customers on one $10 budget may each spend $10, as in LiteLLM).

The limits are copied into the entity's row when ``budget_id`` is set and again on every
``/budget/update`` (which announces each entity it changed), so the request path reads
one row as before: no extra Redis or SQL wait. While an entity names a budget, its own
limit fields may not be set (400 naming the field: change the budget instead); setting
``budget_id`` to null detaches it and keeps the limits it had, now its own. A budget
still named by an entity cannot be deleted (400 listing them; nothing is deleted).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from triogate.api.admin import compat
from triogate.api.admin.bounds import bad
from triogate.api.admin.common import announce, begin, context, not_found, sql, store_of
from triogate.api.admin.fields import (
    LIMIT_FIELDS,
    iso,
    only,
    paging,
    parse_fields,
    render_row,
    required_str,
    str_list,
)
from triogate.api.errors import ApiError
from triogate.api.http import Response
from triogate.governance.principals import Limits

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.admin.converters import Converter
    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.store import BudgetRow, Store

#: Record field → the body field that sets it: what a budget gives an entity.
INHERITED: Mapping[str, str] = {
    "max_budget_nanousd": "max_budget",
    "budget_duration": "budget_duration",
    "tpm_limit": "tpm_limit",
    "rpm_limit": "rpm_limit",
    "max_parallel_requests": "max_parallel_requests",
}

#: /budget/new and /budget/update body fields (LiteLLM's ``BudgetNewRequest``).
BUDGET_FIELDS: Mapping[str, Converter] = compat.table(LIMIT_FIELDS, compat.BUDGET_NOOP)

_KINDS = {"key": "update_key", "team": "update_team", "user": "update_user",
          "end_user": "update_end_user"}


def limits_of(budget: BudgetRow) -> dict[str, Any]:
    """The record fields a budget gives every entity naming it."""
    return {field: getattr(budget, field) for field in INHERITED}


async def inherit(store: Store, fields: dict[str, Any], current: Any = None
                  ) -> dict[str, Any]:
    """``fields`` with the named budget's limits copied in. A checkpoint.

    Args:
        fields: parsed body fields of a key, team, user or end user.
        current: the row being changed (None when creating one).

    Raises:
        ApiError: 400 for a budget that does not exist, or for limit fields set together
            with ``budget_id`` or on an entity that names a budget.
    """
    given = [INHERITED[f] for f in INHERITED if fields.get(f) is not None]
    attached = fields["budget_id"] if "budget_id" in fields else getattr(
        current, "budget_id", None)
    if attached is not None:
        # LiteLLM clients send every field, most null: a null limit asks for nothing here
        # (and must not clear a limit the budget gave).
        fields = {k: v for k, v in fields.items() if not (k in INHERITED and v is None)}
    if "budget_id" not in fields:
        if attached is not None and given:
            raise bad(given[0], f"comes from budget '{attached}': change it with "
                                "/budget/update, or set 'budget_id' to null first")
        return fields
    budget_id = fields["budget_id"]
    if budget_id is None:
        return fields  # detached: the limits it had are now its own
    if given:
        raise bad(given[0], "cannot be set together with 'budget_id': the budget's "
                            "limits apply (change them with /budget/update)")
    with sql(f"look up budget '{budget_id}'"):
        budget = (await store.get_budgets([budget_id])).get(budget_id)
    if budget is None:
        raise ApiError(400, f"budget '{budget_id}' does not exist; create it with "
                       "/budget/new first", "invalid_request_error", param="budget_id",
                       code="budget_not_found")
    return {**fields, **limits_of(budget)}


def render_budget_row(row: BudgetRow, now_ms: int) -> dict[str, Any]:
    """A budget as LiteLLM's ``LiteLLM_BudgetTable`` row (plus the exact nano-USD).

    ``budget_reset_at`` is when the current period ends for an entity attached now
    (periods count from the budget's creation, or its last duration change); null for a
    budget without ``budget_duration``.
    """
    limits = Limits(max_budget_nanousd=row.max_budget_nanousd,
                    budget_duration_s=row.budget_duration_s,
                    budget_anchor_s=row.budget_anchor_s or 0)
    return {**render_row(row), "soft_budget": None, "model_max_budget": None,
            "budget_reset_at": iso(limits.budget_period_end_ms(now_ms))}


async def budget_new(services: Services, request: Request, caller: Caller) -> Response:
    """POST /budget/new: ``budget_id`` (a UUID when absent) and its limits."""
    body = await begin(services, request)
    fields = parse_fields(body, BUDGET_FIELDS, context(services),
                          extra=frozenset({"budget_id"}))
    budget_id = (required_str(body, "budget_id") if body.get("budget_id") is not None
                 else str(uuid.uuid4()))
    with sql(f"create budget '{budget_id}'"):
        row = await store_of(services).create_budget(budget_id=budget_id, **fields)
    return Response.json(render_budget_row(row, services.clock_ms()))


async def budget_update(services: Services, request: Request, caller: Caller) -> Response:
    """POST /budget/update: the new limits, copied into every entity that names it."""
    body = await begin(services, request)
    budget_id = required_str(body, "budget_id")
    fields = parse_fields(body, BUDGET_FIELDS, context(services),
                          extra=frozenset({"budget_id"}))
    store = store_of(services)
    with sql(f"update budget '{budget_id}'"):
        row = await store.update_budget(budget_id, **fields)
        if row is None:
            raise not_found("budget", budget_id, "budget_id")
        users = await store.budget_references(budget_id)
        limits = limits_of(row)
        for kind, ident in users:
            await getattr(store, _KINDS[kind])(ident, **limits)
    headers = await announce(services, *users)
    return Response.json(render_budget_row(row, services.clock_ms()), headers=headers)


async def budget_info(services: Services, request: Request, caller: Caller) -> Response:
    """POST /budget/info ``{"budgets": [ids]}``: the rows, in that order (404 if one is
    missing)."""
    body = await begin(services, request)
    only(body, "budgets")
    ids = list(dict.fromkeys(str_list(body, "budgets")))
    with sql("look up budgets"):
        found = await store_of(services).get_budgets(ids)
    missing = [i for i in ids if i not in found]
    if missing:
        raise ApiError(404, f"budget(s) not found: {', '.join(map(repr, missing))}",
                       "not_found_error", param="budgets")
    return Response.json([render_budget_row(found[i], services.clock_ms()) for i in ids])


async def budget_list(services: Services, request: Request, caller: Caller) -> Response:
    """GET /budget/list?page=&size=: budgets (a bare array, as LiteLLM; 1000 a page)."""
    page, size = paging(request.query, default_size=1000)
    with sql("list budgets"):
        rows, _ = await store_of(services).list_budgets(page=page, size=size)
    return Response.json([render_budget_row(r, services.clock_ms()) for r in rows])


async def budget_delete(services: Services, request: Request, caller: Caller) -> Response:
    """POST /budget/delete ``{"id": ...}``: refused while a key, team, user or end user
    names the budget."""
    body = await begin(services, request)
    only(body, "id", "budget_id")
    name = "id" if "id" in body else "budget_id"
    budget_id = required_str(body, name)
    store = store_of(services)
    with sql(f"delete budget '{budget_id}'"):
        if not await store.get_budgets([budget_id]):
            raise not_found("budget", budget_id, name)
        users = await store.budget_references(budget_id)
        if users:
            named = ", ".join(f"{kind} '{ident[:12]}'" for kind, ident in users[:10])
            raise ApiError(400, f"budget '{budget_id}' is still named by {len(users)} "
                           f"entities ({named}); set their budget_id to null first; "
                           "nothing was deleted", "invalid_request_error", param=name,
                           code="budget_in_use")
        await store.delete_budgets([budget_id])
    return Response.json({"deleted": [budget_id]})


def routes() -> dict[tuple[str, str], Any]:
    """The budget routes, keyed by (method, path), before guarding."""
    return {
        ("POST", "/budget/new"): budget_new,
        ("POST", "/budget/update"): budget_update,
        ("POST", "/budget/info"): budget_info,
        ("GET", "/budget/list"): budget_list,
        ("POST", "/budget/delete"): budget_delete,
    }
