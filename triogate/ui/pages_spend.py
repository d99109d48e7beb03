"""Spend: daily charts by key, team, user, model and tag; the spend log with filters,
paging and CSV export."""

from __future__ import annotations

import csv
import datetime
import io
import re
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs

from triogate.api.http import Response
from triogate.errors import StoreError
from triogate.store.records import STATUSES
from triogate.ui import reports
from triogate.ui.charts import stacked_bars
from triogate.ui.entities import KINDS
from triogate.ui.html import Html, el, field, number, pager, select, table, url, usd, when
from triogate.ui.layout import Flash, section

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.store import SpendLogRow, Store
    from triogate.ui.context import Ctx

PAGE_SIZE = 50
CSV_MAX_ROWS = 10_000
DEFAULT_DAYS = 30
FILTERS = ("start", "end", "key", "key_hash", "team_id", "user_id", "end_user", "tag", "model",
           "status", "cache")
CHARTS = (("key", "Key"), ("team", "Team"), ("user", "User"), ("model", "Model"),
          ("tag", "Tag"))


_HASH = re.compile(r"[0-9a-f]{64}")


class FilterError(ValueError):
    pass


async def resolve_key(store: Store, f: reports.LogFilter) -> reports.LogFilter:
    """An alias names the key that has it now (all its requests, under any alias it had);
    an alias no key has any more matches the requests logged under it. A checkpoint."""
    if f.key_alias is None:
        return f
    rows, _ = await store.list_keys(key_alias=f.key_alias, page=1, size=1)
    return attrs.evolve(f, key_hash=rows[0].token_hash, key_alias=None) if rows else f


def _date_ms(name: str, text: str) -> int:
    try:
        day = datetime.date.fromisoformat(text.strip())
    except ValueError:
        raise FilterError(f"{name}: '{text}' is not a date (YYYY-MM-DD)") from None
    return int(datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC)
               .timestamp() * 1000)


def parse_filter(query: Mapping[str, str], now_ms: int) -> tuple[reports.LogFilter, dict[str, str]]:
    """The spend filter of the query string, and the values to show in the form.

    Without dates: the last 30 days. The end date is inclusive (its whole day).
    """
    values = {k: query.get(k, "").strip()[:200] for k in FILTERS}
    # One "Key" field: a key's alias or its hash (links from a key's page send key_hash).
    values["key"] = values["key"] or values.pop("key_hash")
    values.pop("key_hash", None)
    by_hash = bool(_HASH.fullmatch(values["key"]))
    if not values["start"]:
        values["start"] = reports.day_range(now_ms, DEFAULT_DAYS)[0]
    start = _date_ms("From", values["start"])
    end = _date_ms("To", values["end"]) + reports.MS_PER_DAY if values["end"] else None
    if end is not None and end <= start:
        raise FilterError("'To' must not be before 'From'")
    if values["status"] and values["status"] not in STATUSES:
        raise FilterError(f"status must be one of {', '.join(STATUSES)}")
    cache = {"yes": True, "no": False}.get(values["cache"])
    f = reports.LogFilter(
        start_ms=start, end_ms=end, key_hash=values["key"] if by_hash else None,
        key_alias=values["key"] if values["key"] and not by_hash else None,
        team_id=values["team_id"] or None, user_id=values["user_id"] or None,
        end_user=values["end_user"] or None, tag=values["tag"] or None,
        model_group=values["model"] or None, status=values["status"] or None, cache_hit=cache)
    return f, values


def _filter_form(ctx: Ctx, values: Mapping[str, str]) -> Html:
    groups = sorted(ctx.services.config.groups)
    return el("form", el("div", [
        field("start", "From", value=values["start"], type_="date"),
        field("end", "To", value=values["end"], type_="date"),
        field("key", "Key", value=values["key"], placeholder="alias or hash"),
        field("team_id", "Team", value=values["team_id"]),
        field("user_id", "User", value=values["user_id"]),
        field("end_user", "Customer", value=values["end_user"]),
        field("tag", "Tag", value=values["tag"]),
        select("model", "Model", [("", "any"), *((g, g) for g in groups)], values["model"]),
        select("status", "Status", [("", "any"), *((s, s) for s in STATUSES)], values["status"]),
        select("cache", "Cache hit", [("", "any"), ("yes", "yes"), ("no", "no")],
               values["cache"]),
        el("button", "Apply", type="submit", class_="btn primary"),
        el("a", "Export CSV", href=url("/ui/spend.csv", **values), class_="btn"),
    ], class_="filters"), method="get", action="/ui/spend")


async def _key_names(ctx: Ctx, hashes: list[str]) -> dict[str, str]:
    store = ctx.services.store
    if store is None or not hashes:
        return {}
    rows = await store.get_keys(hashes)
    return {h: r.key_alias or r.key_hint or h[:10] for h, r in rows.items()}


async def _team_names(ctx: Ctx, team_ids: list[str]) -> dict[str, str]:
    store = ctx.services.store
    if store is None or not team_ids:
        return {}
    rows = await store.get_teams(team_ids)
    return {t: r.team_alias for t, r in rows.items() if r.team_alias}


def _name(names: Mapping[str, str], group: str | None, *, none: str = "(none)") -> str:
    return names.get(group or "", group or "") or none


async def _charts(ctx: Ctx, f: reports.LogFilter) -> Html:
    assert ctx.services.store is not None
    end_ms = (f.end_ms - 1) if f.end_ms else ctx.services.clock_ms()
    start_ms = f.start_ms or end_ms
    n = min(366, max(1, (end_ms - start_ms) // reports.MS_PER_DAY + 1))
    days = reports.day_range(end_ms, int(n))
    figures = []
    for i, (group, label) in enumerate(CHARTS):
        rows = await reports.daily(ctx.services.store, f, group_by=group)
        names: dict[str, str] = {}
        if group == "key":
            names = await _key_names(ctx, sorted({r[1] for r in rows if r[1]}))
        elif group == "team":  # a team's alias reads better than its uuid
            names = await _team_names(ctx, sorted({r[1] for r in rows if r[1]}))
        # A request without a key came with the master key.
        none = "master key" if group == "key" else f"(no {label.lower()})"
        series = reports.series(rows, days, partial(_name, names, none=none))
        chart = stacked_bars(days, series, label=f"Spend per day by {label.lower()}",
                             width=1120 if i == 0 else 720)
        figures.append(section(f"By {label.lower()}", chart))
    return Html(figures[0] + el("div", figures[1:], class_="grid2"))


def _log_row(r: SpendLogRow) -> list[Any]:
    if r.key_hash:
        key: Any = el("a", r.key_alias or r.key_hash[:10], href=KINDS["keys"].view_url(r.key_hash))
    else:  # no key row: the master key, or a key that was refused (unknown, blocked, expired)
        key = "(refused key)" if r.http_status == 401 else "master"
    return [when(r.start_time_ms), key, r.team_id or "—", r.user_id or "—",
            r.model_group or "—", r.status, "hit" if r.cache_hit else "",
            number(r.input_tokens), number(r.output_tokens), usd(r.cost_nanousd),
            f"{r.latency_ms:,} ms", _short_id(r.request_id)]


def _short_id(request_id: str) -> Html:
    # 32 hex digits would push the table past a laptop's width: the first 12 (the whole
    # id on hover, and in the CSV export).
    if len(request_id) <= 13:
        return el("code", request_id)
    return el("code", request_id[:12] + "…", title=request_id)


async def spend(ctx: Ctx) -> Response:
    """GET /ui/spend."""
    store = ctx.services.store
    try:
        f, values = parse_filter(ctx.query, ctx.services.clock_ms())
    except FilterError as exc:
        f, values = parse_filter({}, ctx.services.clock_ms())
        ctx = ctx.with_flash(Flash(text=str(exc), kind="error"))
    if store is None:
        return ctx.page("Spend", el("p", "No SQL store is configured.", class_="empty"),
                        active="spend")
    raw = ctx.query.get("page", "1")
    page = max(1, int(raw)) if raw.isdigit() and len(raw) < 7 else 1
    try:
        f = await resolve_key(store, f)
        rows, count = await reports.log_page(store, f, page=page, size=PAGE_SIZE)
        requests, tokens, cost = await reports.total(store, f)
        charts = await _charts(ctx, f)
    except StoreError:
        return ctx.page("Spend", Html(""), active="spend", status=503, flashes=(Flash(
            text="The database did not answer; try again shortly.", kind="error"),))
    summary = el("p", f"{requests:,} requests · {tokens:,} tokens · {usd(cost)}",
                 class_="note")
    logs = section(
        "Spend log", summary,
        table(("Time (UTC)", "Key", "Team", "User", "Model", "Status", "Cache", "In", "Out",
               "Cost", "Latency", "Request id"), [_log_row(r) for r in rows],
              empty="No requests match these filters.", numeric=(7, 8, 9, 10)),
        pager("/ui/spend", page, max(1, -(-count // PAGE_SIZE)), **values))
    content = Html(section("Filters", _filter_form(ctx, values)) + charts + logs)
    return ctx.page("Spend", content, active="spend")


def _cell(value: Any) -> str:
    # A spreadsheet runs a cell that starts with = + - @: make it text.
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


async def spend_csv(ctx: Ctx) -> Response:
    """GET /ui/spend.csv: the filtered spend log (newest first, up to 10,000 rows)."""
    store = ctx.services.store
    try:
        f, _ = parse_filter(ctx.query, ctx.services.clock_ms())
    except FilterError as exc:
        return Response(str(exc).encode(), status=400, content_type="text/plain; charset=utf-8")
    if store is None:
        return Response(b"no SQL store", status=503, content_type="text/plain")
    f = await resolve_key(store, f)
    rows, _ = await reports.log_page(store, f, page=1, size=CSV_MAX_ROWS)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["start_time_utc", "request_id", "api", "key_hash", "key_alias", "team_id",
                     "user_id", "end_user", "tags", "model_group", "deployment_id", "status",
                     "http_status", "cache_hit", "input_tokens", "output_tokens", "cost_usd",
                     "cost_nanousd", "latency_ms"])
    for r in rows:
        writer.writerow([_cell(v) for v in (
            when(r.start_time_ms), r.request_id, r.api, r.key_hash, r.key_alias, r.team_id,
            r.user_id, r.end_user, " ".join(r.tags), r.model_group, r.deployment_id, r.status,
            r.http_status, r.cache_hit, r.input_tokens, r.output_tokens,
            f"{r.cost_nanousd / 1e9:.9f}", r.cost_nanousd, r.latency_ms)])
    return Response(out.getvalue().encode(), content_type="text/csv; charset=utf-8", headers={
        "content-disposition": 'attachment; filename="triogate-spend.csv"',
        "cache-control": "no-store", "x-content-type-options": "nosniff"})
