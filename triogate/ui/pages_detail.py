"""One key, team, user, customer or tag: its settings, its limits' current use, its spend
over the last 30 days, its latest requests, and (for those who may) edit, block, delete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.errors import StoreError
from triogate.ui import forms, reports
from triogate.ui.charts import stacked_bars
from triogate.ui.entities import KINDS, Kind, budget_text, info, status
from triogate.ui.html import (
    Html,
    csrf_input,
    el,
    limit,
    meter,
    number,
    post_button,
    table,
    url,
    usd,
    when,
)
from triogate.ui.layout import section
from triogate.ui.limits import live_use

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.http import Response
    from triogate.ui.context import Ctx

CHART_DAYS = 30


def _props(kind: Kind, row: Mapping[str, Any], now_ms: int, *, links: bool) -> Html:
    items: list[tuple[str, Any]] = [(kind.singular.title() + (" hash" if kind.name == "keys"
                                                               else " id"),
                                     el("code", kind.ident(row)))]
    for name, label in (("key_hint", "Key"), ("key_alias", "Alias"), ("team_alias", "Name"),
                        ("user_alias", "Name"), ("alias", "Name"), ("user_email", "Email"),
                        ("user_role", "Role"),
                        ("description", "Description")):
        if row.get(name):
            items.append((label, row[name]))
    team, user = row.get("team_id"), row.get("user_id")
    if kind.name == "keys":
        items.append(("Team", (el("a", team, href=KINDS["teams"].view_url(team)) if links
                               else team) if team else "—"))
        items.append(("User", (el("a", user, href=KINDS["users"].view_url(user)) if links
                               else user) if user else "—"))
    if "models" in row:
        items.append(("Models", ", ".join(row["models"]) or "all"))
    if row.get("tags"):
        items.append(("Tags", ", ".join(row["tags"])))
    if row.get("metadata"):
        items.append(("Metadata", el("code", forms.shown(row["metadata"], forms.SPECS[
            "metadata"]))))
    items.append(("Status", status(row, now_ms)))
    if "expires_at_ms" in row:
        items.append(("Expires", when(row.get("expires_at_ms"))))
    items.append(("Created", when(row.get("created_at_ms"))))
    items.append(("Updated", when(row.get("updated_at_ms"))))
    return el("dl", [[el("dt", k), el("dd", v)] for k, v in items], class_="props")


def _by(kind: Kind, ident: str) -> dict[str, Any]:
    return {kind.filter_field: ident}


async def _use(ctx: Ctx, kind: Kind, ident: str, row: Mapping[str, Any]) -> Html:
    """Each limit next to its current use."""
    store = ctx.services.store
    now_ms = ctx.services.clock_ms()
    minute = None
    if store is not None:
        try:
            minute = await reports.total(store, reports.LogFilter(
                start_ms=now_ms - 60_000, **_by(kind, ident)))
        except StoreError:
            minute = None
    spend, cap = row.get("spend_nanousd"), row.get("max_budget_nanousd")
    period = row.get("budget_duration")
    spend_text = f"{usd(spend)} of {usd(cap)}" if cap is not None else f"{usd(spend)} (no cap)"
    rows: list[list[Any]] = [[
        "Budget" + (f" (per {period})" if period else ""), meter(spend, cap, spend_text),
        f"resets {str(row['budget_reset_at'])[:19].replace('T', ' ')}"
        if row.get("budget_reset_at") else "",
    ]]
    soft = row.get("soft_budget_nanousd")
    if soft is not None:  # an alert, not a refusal, past it
        rows.append(["Soft budget", meter(spend, soft, f"{usd(spend)} of {usd(soft)}"),
                     "alerts when crossed"])
    live = await live_use(ctx.services, kind.name, ident)
    for label, enforced, logged, cap_name in (
        ("Requests per minute", live.rpm, minute[0] if minute else None, "rpm_limit"),
        ("Tokens per minute", live.tpm, minute[1] if minute else None, "tpm_limit"),
    ):
        cap_v = row.get(cap_name)
        # With a limit, the window the gateway enforces; without, what the logs say.
        used: int | None
        if cap_v is not None and enforced is not None:
            used, source = enforced, "last 60 s, the enforced window"
        else:
            used, source = logged, "last 60 s, from the spend logs"
        text = (f"{number(used)} of {limit(cap_v)}" if cap_v is not None
                else f"{number(used)}, no limit")
        rows.append([label, meter(used, cap_v, text), source])
    if "max_parallel_requests" in row:
        cap_p = row.get("max_parallel_requests")
        now = live.parallel if cap_p is not None else None
        rows.append(["Parallel requests",
                     meter(now, cap_p, f"{number(now)} of {limit(cap_p)}" if cap_p is not None
                           else "no limit"),
                     "in flight now" if cap_p is not None else ""])
    # The note (where the figure comes from, when it resets) sits under the figure.
    cells = [[label, el("div", use, el("br"), el("small", note, class_="note")) if note
              else use] for label, use, note in rows]
    return table(("Limit", "Current use"), cells, wrap=(1,))


async def _spend(ctx: Ctx, kind: Kind, ident: str) -> tuple[Html, Html]:
    store = ctx.services.store
    if store is None:
        return Html(""), Html("")
    now_ms = ctx.services.clock_ms()
    days = reports.day_range(now_ms, CHART_DAYS)
    since = reports.day_start_ms(now_ms) - (CHART_DAYS - 1) * reports.MS_PER_DAY
    f = reports.LogFilter(start_ms=since, **_by(kind, ident))
    try:
        daily = await reports.daily(store, f, group_by="model")
        recent, total = await reports.log_page(store, f, page=1, size=10)
    except StoreError:
        return el("p", "The database did not answer.", class_="empty"), Html("")
    chart = stacked_bars(days, reports.series(daily, days, lambda g: g or "-"),
                         label=f"Spend per day by model, last {CHART_DAYS} days", width=1120)
    can_read = ctx.principal is not None and ctx.principal.can("read")
    link = (el("a", f"All {total} requests in the spend log →",
               href=url("/ui/spend", **{kind.filter_field: ident})) if can_read
            else el("span", f"{total} requests in the last {CHART_DAYS} days", class_="note"))
    rows = [(when(r.start_time_ms), r.model_group or "—", r.status,
             "hit" if r.cache_hit else "", number(r.input_tokens + r.output_tokens),
             usd(r.cost_nanousd), f"{r.latency_ms:,} ms") for r in recent]
    logs = table(("Time (UTC)", "Model", "Status", "Cache", "Tokens", "Cost", "Latency"), rows,
                 empty="No requests in the last 30 days.", numeric=(4, 5, 6))
    return chart, Html(logs + el("p", link))


def _edit(ctx: Ctx, kind: Kind, ident: str, row: Mapping[str, Any]) -> Html:
    form = el("form", csrf_input(ctx.csrf), el("input", type="hidden", name="id", value=ident),
              forms.render_fields(kind.name, row, creating=False),
              el("button", "Save changes", type="submit", class_="btn primary"),
              method="post", action=f"/ui/{kind.name}/update")
    buttons = []
    if kind.blockable:
        verb = "unblock" if row.get("blocked") else "block"
        buttons.append(post_button(f"/ui/{kind.name}/{verb}", verb.title(), ctx.csrf,
                                   fields={"id": ident}, danger=verb == "block"))
    buttons.append(post_button(
        f"/ui/{kind.name}/delete", f"Delete {kind.singular}", ctx.csrf, fields={"id": ident},
        danger=True, confirm=f"Delete this {kind.singular}? This cannot be undone."))
    return Html(section("Edit", form) + section("Actions", el("div", buttons, class_="actions")))


def may_change(ctx: Ctx, kind: Kind, row: Mapping[str, Any]) -> bool:
    """Whether to offer the edit form and actions (the admin API checks again)."""
    p = ctx.principal
    if p is None:
        return False
    return p.can("write") or (kind.name == "keys" and p.can("team")
                              and row.get("team_id") in p.caller.admin_of)


async def detail(ctx: Ctx, kind: Kind, ident: str, row: Mapping[str, Any]) -> Response:
    """The page of one row (``row``: the admin API's ``info``)."""
    now_ms = ctx.services.clock_ms()
    can_read = ctx.principal is not None and ctx.principal.can("read")
    chart, logs = await _spend(ctx, kind, ident)
    parts = [
        el("div", section("Settings", _props(kind, row, now_ms, links=can_read)),
           section("Limits and current use", await _use(ctx, kind, ident, row),
                   el("p", f"Budget: {budget_text(row)}", class_="note")), class_="grid2"),
        section("Spend over time", chart),
        section("Latest requests", logs),
    ]
    keys = row.get("keys")
    if isinstance(keys, list) and kind.name in ("teams", "users"):
        k = KINDS["keys"]
        parts.append(section("Keys", table(
            ("Alias", "Key", "Budget", "Status"),
            [(el("a", k.label(r), href=k.view_url(k.ident(r))), el("code", r.get("key_hint")),
              budget_text(r), status(r, now_ms)) for r in keys],
            empty=f"This {kind.singular} has no keys.")))
    members = row.get("members_with_roles")
    if kind.name == "teams" and isinstance(members, list):
        u = KINDS["users"]
        parts.append(section("Members", table(
            ("User", "Email", "Role in the team"),
            [((el("a", m.get("user_id"), href=u.view_url(str(m.get("user_id"))))
               if can_read else m.get("user_id")), m.get("user_email") or "—",
              m.get("role") or "user") for m in members if isinstance(m, dict)],
            empty="No members: add them with /team/member_add.")))
    if may_change(ctx, kind, row):
        parts.append(_edit(ctx, kind, ident, row))
    elif (kind.name == "teams" and ctx.principal is not None
          and ident in ctx.principal.caller.admin_of):
        parts.append(section("Keys of this team", el("a", "New key for this team",
                                                     href=url("/ui/keys/new", team_id=ident),
                                                     class_="btn primary")))
    return ctx.page(f"{kind.singular.title()} {kind.label(row)}", Html("".join(parts)),
                    active=kind.name)


async def own_key(ctx: Ctx) -> Response:
    """GET /ui/mine: a virtual key's own page (read-only)."""
    assert ctx.principal is not None and ctx.principal.key_hash is not None
    kind = KINDS["keys"]
    row = await info(ctx.services, kind, ctx.principal.key_hash, ctx.caller)
    return await detail(ctx, kind, ctx.principal.key_hash, row)
