"""LiteLLM's dashboard spend routes (``/global/spend/...``, ``/spend/tags``), from the spend
logs.

LiteLLM answers most of them from views over its spend table (``MonthlyGlobalSpend``,
``Last30dKeysBySpend``, ``DailyTagSpend`` ...); triogate sums its own spend logs in SQL
into the same JSON. Where LiteLLM's view covers "the last 30 days" (from midnight UTC
30 days ago), so does the route, unless ``start_date`` / ``end_date`` narrow it (as in
``/spend/logs``: ISO 8601 or epoch ms; a bare ``end_date`` includes that day).

* ``GET /global/spend``: ``{"spend", "max_budget"}``, the last 30 days' total and the
  proxy-wide budget (``litellm_settings.max_budget``; 0 without one, as LiteLLM).
* ``GET /global/spend/logs``: ``[{"date", "spend"}]`` per UTC day; with ``api_key``,
  that key's days (``{"date", "spend", "api_key"}``).
* ``GET /global/spend/keys?limit=``: ``[{"api_key", "key_alias", "key_name", "team_id",
  "total_spend"}]``, the keys that spent most first (every key without ``limit``).
* ``GET /global/spend/models?limit=10``: ``[{"model", "total_spend"}]`` per upstream model.
* ``GET /global/spend/teams``: ``{"daily_spend": [{"date", <team>: spend, ...}],
  "teams", "total_spend_per_team": [{"team_id", "total_spend"}]}`` (the top 10); a team
  is named by its alias, else its id; keys without a team are ``Unassigned``.
* ``GET`` / ``POST /global/spend/end_users``: ``[{"end_user", "total_count",
  "total_spend"}]``, the top 100 customers; ``api_key``, ``startTime`` and ``endTime``
  (default: the last 30 days up to now) in the body (POST) or the query (GET).
* ``GET /global/spend/tags?start_date=&end_date=&tags=a,b``: ``{"spend_per_tag":
  [{"name", "spend", "log_count"}]}``; ``all-tags`` (or no ``tags``) means every tag.
* ``GET /spend/tags``: ``[{"individual_request_tag", "log_count", "total_spend"}]``.
* ``GET /global/spend/provider?start_date=&end_date=``: ``[{"provider", "spend"}]``, per
  provider of the deployment that answered (``Unknown`` for a deployment no longer in
  the config).

Sums are exact (integer nano-USD in SQL); each USD float has its ``*_nanousd`` next to it
(but in ``daily_spend``, whose keys are team names). Admins and viewers only (``roles``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api.admin.common import sql, store_of
from triogate.api.admin.fields import key_candidates, only, parse_time_ms, usd
from triogate.api.admin.spend import filters
from triogate.api.errors import ApiError
from triogate.api.http import Response, json_object

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services

_MS_PER_DAY = 86_400_000
#: LiteLLM's views cover ``CURRENT_DATE - INTERVAL '30 days'`` onwards.
WINDOW_DAYS = 30
#: The largest ``limit`` taken (LiteLLM has none; this bounds one answer).
MAX_LIMIT = 100_000
#: LiteLLM's ``/global/spend/end_users`` answers its top 100.
END_USERS_LIMIT = 100
#: LiteLLM's ``/global/spend/teams`` lists its top 10 in ``total_spend_per_team``.
TOP_TEAMS = 10
UNASSIGNED = "Unassigned"
UNKNOWN_PROVIDER = "Unknown"
_DATES = ("start_date", "end_date")


def _window(services: Services, query: Mapping[str, str], *names: str) -> dict[str, Any]:
    """The spend filter of ``start_date``, ``end_date`` and ``names`` (``api_key`` ...);
    without ``start_date``, from midnight UTC 30 days ago."""
    found = filters({k: v for k, v in query.items() if k in (*_DATES, *names)})
    if "start_ms" not in found:
        today_ms = services.clock_ms() // _MS_PER_DAY * _MS_PER_DAY
        found["start_ms"] = today_ms - WINDOW_DAYS * _MS_PER_DAY
        if found.get("end_ms", found["start_ms"] + 1) <= found["start_ms"]:
            raise ApiError(400, "'end_date' is before the default window (the last "
                           f"{WINDOW_DAYS} days): give 'start_date' too", param="end_date")
    return found


def _required_dates(query: Mapping[str, str]) -> None:
    for name in _DATES:
        if not query.get(name):
            raise ApiError(400, f"missing query parameter '{name}' (YYYY-MM-DD)", param=name)


def _limit(query: Mapping[str, str], default: int | None) -> int | None:
    """``limit`` (1..:data:`MAX_LIMIT`), else ``default``."""
    raw = query.get("limit")
    if raw is None or raw == "":
        return default
    if len(raw) > 9 or not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ApiError(400, f"query parameter 'limit' must be an integer in 1..{MAX_LIMIT}",
                       param="limit")
    return int(raw)


def _money(name: str, nanousd: int) -> dict[str, Any]:
    return {name: usd(nanousd), f"{name}_nanousd": nanousd}


async def global_spend(services: Services, request: Request, caller: Caller) -> Response:
    """GET /global/spend: the last 30 days' spend and the proxy-wide budget."""
    found = _window(services, request.query)
    with sql("sum spend"):
        totals = await store_of(services).spend_totals(**found)
    budget = services.config.governance.proxy_max_budget_nanousd or 0
    return Response.json({**_money("spend", totals.cost_nanousd),
                          **_money("max_budget", budget)})


async def global_spend_logs(services: Services, request: Request, caller: Caller
                            ) -> Response:
    """GET /global/spend/logs[?api_key=]: spend per UTC day, oldest first."""
    found = _window(services, request.query, "api_key")
    with sql("sum spend per day"):
        rows = await store_of(services).spend_breakdown(columns=(), by_day=True, **found)
    days = [{"date": r["day"], **_money("spend", r["cost_nanousd"])} for r in rows]
    if "key_hash" in found:
        days = [{**d, "api_key": found["key_hash"]} for d in days]
    return Response.json(sorted(days, key=lambda d: str(d["date"])))


async def global_spend_keys(services: Services, request: Request, caller: Caller
                            ) -> Response:
    """GET /global/spend/keys[?limit=]: the keys that spent most in the last 30 days."""
    limit = _limit(request.query, None)
    found = _window(services, request.query)
    store = store_of(services)
    with sql("sum spend per key"):
        rows = await store.top_spend(column="key", limit=limit, **found)
        keys = await store.get_keys(sorted({r["key"] for r in rows if r["key"]}))
    out = []
    for r in rows:
        key = keys.get(r["key"]) if r["key"] else None
        out.append({"api_key": r["key"],
                    "key_alias": key.key_alias if key else None,
                    "key_name": key.key_hint if key else None,
                    "team_id": key.team_id if key else None,
                    **_money("total_spend", r["cost_nanousd"])})
    return Response.json(out)


async def global_spend_models(services: Services, request: Request, caller: Caller
                              ) -> Response:
    """GET /global/spend/models[?limit=10]: the upstream models that cost most."""
    limit = _limit(request.query, 10)
    found = _window(services, request.query)
    with sql("sum spend per model"):
        rows = await store_of(services).top_spend(column="model", limit=limit,
                                                  skip_empty=True, **found)
    return Response.json([{"model": r["model"], **_money("total_spend", r["cost_nanousd"])}
                          for r in rows])


async def global_spend_teams(services: Services, request: Request, caller: Caller
                             ) -> Response:
    """GET /global/spend/teams: per UTC day and team, the teams, the top 10 teams."""
    found = _window(services, request.query)
    store = store_of(services)
    with sql("sum spend per team"):
        rows = await store.spend_breakdown(columns=("team",), by_day=True, **found)
        teams = await store.get_teams(sorted({r["team"] for r in rows if r["team"]}))
    names = {t: row.team_alias or t for t, row in teams.items()}
    daily: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for r in rows:
        name = names.get(r["team"], r["team"]) if r["team"] else UNASSIGNED
        day = daily.setdefault(r["day"], {})
        day[name] = day.get(name, 0) + r["cost_nanousd"]
        totals[name] = totals.get(name, 0) + r["cost_nanousd"]
    top = sorted(totals.items(), key=lambda item: (-item[1], item[0]))[:TOP_TEAMS]
    return Response.json({
        "daily_spend": [{"date": day, **{name: usd(v) for name, v in spend.items()}}
                        for day, spend in sorted(daily.items())],
        "teams": sorted(totals),
        "total_spend_per_team": [{"team_id": name, **_money("total_spend", v)}
                                 for name, v in top],
    })


async def global_spend_end_users(services: Services, request: Request, caller: Caller
                                 ) -> Response:
    """GET or POST /global/spend/end_users: the top 100 customers by spend
    (``api_key``, ``startTime``, ``endTime``; default the last 30 days up to now)."""
    params: Mapping[str, Any] = request.query
    if request.method == "POST":
        params = await _optional_body(services, request)
        only(params, "api_key", "startTime", "endTime")
    now_ms = services.clock_ms()
    found: dict[str, Any] = {
        "start_ms": now_ms - WINDOW_DAYS * _MS_PER_DAY, "end_ms": now_ms}
    for name, field in (("startTime", "start_ms"), ("endTime", "end_ms")):
        if params.get(name) not in (None, ""):
            found[field] = parse_time_ms(name, params[name])
    if found["start_ms"] >= found["end_ms"]:
        raise ApiError(400, "'startTime' must be before 'endTime'", param="startTime")
    api_key = params.get("api_key")
    if api_key not in (None, ""):
        if not isinstance(api_key, str):
            raise ApiError(400, "field 'api_key' must be a string", param="api_key")
        found["key_hash"] = key_candidates(api_key)[0]
    limit = _limit(request.query, END_USERS_LIMIT) if request.method == "GET" \
        else END_USERS_LIMIT
    with sql("sum spend per customer"):
        rows = await store_of(services).top_spend(column="end_user", limit=limit, **found)
    return Response.json([{"end_user": r["end_user"], "total_count": r["requests"],
                           **_money("total_spend", r["cost_nanousd"])} for r in rows])


async def _optional_body(services: Services, request: Request) -> dict[str, Any]:
    """The JSON object of the body, ``{}`` for none (LiteLLM's body is optional). A
    checkpoint."""
    raw = await request.body(services.config.settings.max_body_bytes)
    return json_object(raw) if raw.strip() else {}


def _tags(query: Mapping[str, str]) -> list[str] | None:
    """``tags=a,b`` as a list; None for every tag (absent, empty or ``all-tags``)."""
    raw = query.get("tags")
    if not raw:
        return None
    tags = [t for t in (part.strip() for part in raw.split(",")) if t]
    return None if not tags or "all-tags" in tags else tags


async def global_spend_tags(services: Services, request: Request, caller: Caller
                            ) -> Response:
    """GET /global/spend/tags?start_date=&end_date=[&tags=a,b]: spend per request tag."""
    _required_dates(request.query)
    found = _window(services, request.query)
    with sql("sum spend per tag"):
        rows = await store_of(services).tag_spend(tags=_tags(request.query), **found)
    return Response.json({"spend_per_tag": [
        {"name": r["tag"], **_money("spend", r["cost_nanousd"]), "log_count": r["requests"]}
        for r in rows]})


async def spend_tags(services: Services, request: Request, caller: Caller) -> Response:
    """GET /spend/tags[?start_date=&end_date=]: spend per request tag, every day unless
    dates are given."""
    found = filters({k: v for k, v in request.query.items() if k in _DATES})
    with sql("sum spend per tag"):
        rows = await store_of(services).tag_spend(**found)
    return Response.json([
        {"individual_request_tag": r["tag"], "log_count": r["requests"],
         **_money("total_spend", r["cost_nanousd"])} for r in rows])


async def global_spend_provider(services: Services, request: Request, caller: Caller
                                ) -> Response:
    """GET /global/spend/provider?start_date=&end_date=: spend per provider."""
    _required_dates(request.query)
    found = _window(services, request.query)
    with sql("sum spend per deployment"):
        rows = await store_of(services).top_spend(column="deployment", limit=None,
                                                  skip_empty=True, **found)
    providers = {d.id: d.provider for d in services.config.deployments}
    spend: dict[str, int] = {}
    for r in rows:
        provider = providers.get(r["deployment"], UNKNOWN_PROVIDER)
        spend[provider] = spend.get(provider, 0) + r["cost_nanousd"]
    return Response.json([{"provider": p, **_money("spend", v)}
                          for p, v in sorted(spend.items(), key=lambda i: (-i[1], i[0]))])


#: (method, path) → handler, merged into the admin table by ``routes.py``.
ROUTES = {
    ("GET", "/global/spend"): global_spend,
    ("GET", "/global/spend/logs"): global_spend_logs,
    ("GET", "/global/spend/keys"): global_spend_keys,
    ("GET", "/global/spend/models"): global_spend_models,
    ("GET", "/global/spend/teams"): global_spend_teams,
    ("GET", "/global/spend/end_users"): global_spend_end_users,
    ("POST", "/global/spend/end_users"): global_spend_end_users,
    ("GET", "/global/spend/tags"): global_spend_tags,
    ("GET", "/spend/tags"): spend_tags,
    ("GET", "/global/spend/provider"): global_spend_provider,
}
