"""``GET /global/spend/report``: LiteLLM's spend report, for charging teams, customers and
key owners back.

``start_date`` and ``end_date`` (``YYYY-MM-DD``, both days included) are required, as in
LiteLLM. ``group_by``:

* ``team`` (the default): per UTC day, each team's spend (``team_name`` is its alias,
  else its id; ``Unassigned Team`` for keys without one), with ``metadata`` listing the
  spend per (model, key);
* ``customer``: the same per end user (``customer``);
* ``api_key``: per key, its totals and ``model_details`` per model. Giving ``api_key``
  (a raw key or its hash) or ``internal_user_id`` answers in this shape too, for that
  key or that user's keys.

Sums are exact (integer nano-USD in SQL); ``total_spend`` / ``total_cost`` are USD
floats, with the ``*_nanousd`` figure next to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from triogate.api.admin.common import sql, store_of
from triogate.api.admin.fields import usd
from triogate.api.admin.spend import filters
from triogate.api.errors import ApiError
from triogate.api.http import Response

if TYPE_CHECKING:
    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services

GROUP_BY = ("team", "customer", "api_key")
_UNASSIGNED = {"team": "Unassigned Team", "customer": "Unassigned Customer"}


async def spend_report(services: Services, request: Request, caller: Caller) -> Response:
    """GET /global/spend/report?start_date=&end_date=&group_by=team|customer|api_key."""
    query = request.query
    for name in ("start_date", "end_date"):
        if not query.get(name):
            raise ApiError(400, f"missing query parameter '{name}' (YYYY-MM-DD)", param=name)
    group_by = query.get("group_by") or "team"
    if group_by not in GROUP_BY:
        raise ApiError(400, f"query parameter 'group_by' must be one of "
                       f"{', '.join(GROUP_BY)}", param="group_by")
    found = filters({k: v for k, v in query.items()
                     if k in ("start_date", "end_date", "api_key")})
    if query.get("internal_user_id"):
        found["user_id"] = query["internal_user_id"]
    store = store_of(services)
    if group_by == "api_key" or "key_hash" in found or "user_id" in found:
        with sql("sum spend per key"):
            rows = await store.spend_breakdown(columns=("key", "model_group"), by_day=False,
                                               **found)
        return Response.json(_per_key(rows))
    column: Literal["team", "end_user"] = "team" if group_by == "team" else "end_user"
    with sql("sum spend per day"):
        rows = await store.spend_breakdown(columns=(column, "model_group", "key"),
                                           by_day=True, **found)
        names: dict[str, str] = {}
        if group_by == "team":
            teams = await store.get_teams(sorted({r["team"] for r in rows if r["team"]}))
            names = {t: row.team_alias or t for t, row in teams.items()}
    return Response.json(_per_day(rows, group_by, column, names))


def _per_day(rows: list[dict[str, Any]], group_by: str, column: str,
             names: dict[str, str]) -> list[dict[str, Any]]:
    plural, label = ("teams", "team_name") if group_by == "team" else (
        "customers", "customer")
    days: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        ident = row[column]
        name = names.get(ident, ident) if ident else _UNASSIGNED[group_by]
        entry = days.setdefault(row["day"], {}).setdefault(name, {
            label: name, "total_spend": 0.0, "total_spend_nanousd": 0, "metadata": []})
        entry["total_spend_nanousd"] += row["cost_nanousd"]
        entry["total_spend"] = usd(entry["total_spend_nanousd"])
        entry["metadata"].append({
            "model": row["model_group"], "spend": usd(row["cost_nanousd"]),
            "spend_nanousd": row["cost_nanousd"],
            "total_tokens": row["input_tokens"] + row["output_tokens"],
            "api_key": row["key"]})
    return [{"group_by_day": f"{day}T00:00:00+00:00", plural: list(groups.values())}
            for day, groups in sorted(days.items())]


def _per_key(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys: dict[str | None, dict[str, Any]] = {}
    for row in rows:
        entry = keys.setdefault(row["key"], {
            "api_key": row["key"], "total_cost": 0.0, "total_cost_nanousd": 0,
            "total_input_tokens": 0, "total_output_tokens": 0, "model_details": []})
        entry["total_cost_nanousd"] += row["cost_nanousd"]
        entry["total_cost"] = usd(entry["total_cost_nanousd"])
        entry["total_input_tokens"] += row["input_tokens"]
        entry["total_output_tokens"] += row["output_tokens"]
        entry["model_details"].append({
            "model": row["model_group"], "total_cost": usd(row["cost_nanousd"]),
            "total_cost_nanousd": row["cost_nanousd"],
            "total_input_tokens": row["input_tokens"],
            "total_output_tokens": row["output_tokens"]})
    return sorted(keys.values(), key=lambda e: -int(e["total_cost_nanousd"]))
