"""``/spend/logs``, ``/spend/logs/v2`` and ``/spend/daily``: reports over the SQL spend logs.

``/spend/logs`` answers as LiteLLM does: a bare JSON array of rows, newest first (at most
``size`` rows, default 1000, from ``page``). ``/spend/logs/v2`` (also ``/spend/logs/ui``)
is the paginated form: ``{"data": [...], "total", "page", "page_size", "total_pages",
"totals"}``.

Filters (query parameters, all optional): ``request_id`` (the response's
``x-request-id`` / ``x-litellm-call-id``, or the client's own ``x-request-id``),
``api_key`` (a raw key or its hash) or ``key_hash``, ``team_id``, ``user_id``,
``end_user``, ``tag``, ``start_date`` and ``end_date``. Dates are ISO 8601 (naive = UTC)
or epoch milliseconds; ``start_date`` is inclusive; ``end_date`` is exclusive, except
that a bare date (``2025-01-31``) includes that whole day, as a person reading a report
expects.

Sums are computed by the database over integer nano-USD, so totals are exact; ``spend``
(USD, a float) is shown next to ``spend_nanousd`` (the exact value).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson

from triogate.api.admin.common import sql, store_of
from triogate.api.admin.fields import (
    iso,
    key_candidates,
    page_count,
    paging,
    parse_time_ms,
    usd,
)
from triogate.api.admin.roles import INTERNAL, INTERNAL_VIEWER, forbidden
from triogate.api.errors import ApiError
from triogate.api.http import Response

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.store import SpendLogRow

_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_MS_PER_DAY = 86_400_000
GROUPS = ("key", "team", "user", "end_user", "model_group")


def filters(query: Mapping[str, str]) -> dict[str, Any]:
    """The store's spend filter from query parameters.

    Raises:
        ApiError: 400 for a bad date, or ``api_key`` and ``key_hash`` that disagree.
    """
    out: dict[str, Any] = {}
    api_key = query.get("api_key")
    if api_key:
        # A 64-hex value is taken as the hash (LiteLLM's own reports pass hashes).
        out["key_hash"] = key_candidates(api_key)[0]
    key_hash = query.get("key_hash")
    if key_hash:
        if out.get("key_hash", key_hash) != key_hash:
            raise ApiError(400, "'api_key' and 'key_hash' name different keys", param="key_hash")
        out["key_hash"] = key_hash
    for name in ("request_id", "team_id", "user_id", "end_user", "tag"):
        if query.get(name):
            out[name] = query[name]
    start = query.get("start_date")
    if start:
        out["start_ms"] = parse_time_ms("start_date", start)
    end = query.get("end_date")
    if end:
        end_ms = parse_time_ms("end_date", end)
        out["end_ms"] = end_ms + _MS_PER_DAY if _DATE_ONLY.match(end.strip()) else end_ms
    if "start_ms" in out and "end_ms" in out and out["start_ms"] >= out["end_ms"]:
        raise ApiError(400, "'start_date' must be before 'end_date'", param="start_date")
    return out


def render_log(row: SpendLogRow) -> dict[str, Any]:
    """A spend-log row with LiteLLM's names (``api_key`` is the key's hash)."""
    return {
        "request_id": row.request_id,
        "response_id": row.response_id,
        "client_request_id": row.client_request_id,
        "call_type": row.api,
        "api_key": row.key_hash,
        "key_alias": row.key_alias,
        "team_id": row.team_id,
        "user": row.user_id,
        "end_user": row.end_user,
        "request_tags": list(row.tags),
        "model_group": row.model_group,
        "model": row.upstream_model,
        "model_id": row.deployment_id,
        "prompt_tokens": row.input_tokens,
        "completion_tokens": row.output_tokens,
        "total_tokens": row.input_tokens + row.output_tokens,
        "spend": usd(row.cost_nanousd),
        "spend_nanousd": row.cost_nanousd,
        "cache_hit": row.cache_hit,
        "status": row.status,
        "http_status": row.http_status,
        "latency_ms": row.latency_ms,
        "startTime": iso(row.start_time_ms),
        "endTime": iso(row.end_time_ms),
        "start_time_ms": row.start_time_ms,
        "end_time_ms": row.end_time_ms,
        "guardrails": orjson.loads(row.guardrails) if row.guardrails else [],
        "metadata": _json(row.metadata) or {},
        "cache_key": row.cache_key,
        "api_base": row.api_base,
        "messages": _json(row.messages),
        "response": _json(row.response),
    }


def _json(text: str | None) -> Any:
    """A JSON-text column's value (None when empty or unreadable)."""
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def scoped(caller: Caller, found: dict[str, Any]) -> dict[str, Any]:
    """Narrow a filter to what the caller may see: every row for admins and viewers, a
    user's own requests, a key's own requests."""
    if caller.sees_all:
        return found
    if caller.user_id is not None and caller.role in (INTERNAL, INTERNAL_VIEWER):
        if found.get("user_id", caller.user_id) != caller.user_id:
            raise forbidden("read another user's spend")
        return {**found, "user_id": caller.user_id}
    if found.get("key_hash", caller.key_hash) != caller.key_hash:
        raise forbidden("read another key's spend")
    return {**found, "key_hash": caller.key_hash}


async def spend_logs(services: Services, request: Request, caller: Caller) -> Response:
    """GET /spend/logs: matching rows, newest first, as a bare array (LiteLLM's shape)."""
    page, size = paging(request.query, default_size=1000)
    found = scoped(caller, filters(request.query))
    with sql("query spend logs"):
        rows, _ = await store_of(services).query_spend_logs(page=page, size=size, **found)
    return Response.json([render_log(r) for r in rows])


async def spend_logs_paged(services: Services, request: Request, caller: Caller
                           ) -> Response:
    """GET /spend/logs/v2 (and /spend/logs/ui): a page of rows, the count, exact totals."""
    page, size = paging(request.query, default_size=50)
    found = scoped(caller, filters(request.query))
    store = store_of(services)
    with sql("query spend logs"):
        rows, total = await store.query_spend_logs(page=page, size=size, **found)
        totals = await store.spend_totals(**found)
    return Response.json({
        "data": [render_log(r) for r in rows],
        "total": total,
        "page": page,
        "page_size": size,
        "total_pages": page_count(total, size),
        "totals": {
            "requests": totals.requests,
            "input_tokens": totals.input_tokens,
            "output_tokens": totals.output_tokens,
            "spend": usd(totals.cost_nanousd),
            "spend_nanousd": totals.cost_nanousd,
        },
    })


async def spend_daily(services: Services, request: Request, caller: Caller) -> Response:
    """GET /spend/daily?group_by=key|team|user|end_user|model_group: per UTC day and group."""
    group_by = request.query.get("group_by", "key")
    if group_by not in GROUPS:
        raise ApiError(400, f"query parameter 'group_by' must be one of {', '.join(GROUPS)}",
                       param="group_by")
    found = filters(request.query)
    with sql("sum daily spend"):
        days = await store_of(services).daily_spend(group_by=group_by, **found)  # type: ignore[arg-type]
    return Response.json({
        "group_by": group_by,
        "results": [
            {
                "date": d.day,
                "group_id": d.group_id,
                "requests": d.requests,
                "input_tokens": d.input_tokens,
                "output_tokens": d.output_tokens,
                "spend": usd(d.cost_nanousd),
                "spend_nanousd": d.cost_nanousd,
            }
            for d in days
        ],
    })
