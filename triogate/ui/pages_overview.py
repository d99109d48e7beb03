"""The overview: traffic, latency, spend, Redis waits per request, and the accounting queues."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from triogate.errors import StoreError
from triogate.ui import reports, stats
from triogate.ui.charts import histogram
from triogate.ui.html import Html, badge, card, el, number, table, usd
from triogate.ui.layout import section

if TYPE_CHECKING:
    from triogate.api.http import Response
    from triogate.ui.context import Ctx

REFRESH_S = 5


def _alerts(ctx: Ctx) -> Html:
    """Budget alerts this process queued (newest first), and how their sending went."""
    alerts = ctx.services.alerts
    if alerts is None:
        return Html("")
    rows = []
    for alert in reversed(alerts.recent):
        body = alert.payload()
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(alert.at_ms / 1000))
        rows.append((when, body["event_message"], alert.label, usd(alert.spend_nanousd),
                     usd(alert.soft_budget_nanousd if alert.threshold == "soft"
                         else alert.max_budget_nanousd)))
    return section(
        "Budget alerts",
        table(("Time (UTC)", "Alert", "Who", "Spend", "Limit"), rows, numeric=(3, 4),
              empty="No budget alert yet."),
        note=f"Soft budgets and 50/80/100 % of hard budgets, one alert per budget period, "
             f"posted to the alerting webhook: {alerts.delivered} delivered, "
             f"{alerts.failed} failed, {alerts.dropped} dropped, {alerts.queued} queued "
             "(this process).")


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:,.0f} ms"


async def overview(ctx: Ctx) -> Response:
    """GET /ui."""
    services = ctx.services
    figures = stats.overview(services, ctx.sampler, time.monotonic())
    now_ms = services.clock_ms()
    today = month = None
    if services.store is not None:
        try:
            today = (await reports.total(services.store, reports.LogFilter(
                start_ms=reports.day_start_ms(now_ms))))[2]
            month = (await reports.total(services.store, reports.LogFilter(
                start_ms=reports.month_start_ms(now_ms))))[2]
        except StoreError:
            pass
    workers = await stats.share_workers(services, figures, now_ms)
    every = stats.combine(workers)
    window = (f"last {every.window_s:.0f} s" if every.window_s else "since start")
    who = f"{every.processes} processes" if every.processes > 1 else "this process"
    rate = every.error_rate
    cards = el("div", [
        card("Requests / s", number(every.requests_per_s, 2), f"{window}, {who}"),
        card("Error rate", "—" if rate is None else f"{rate:.1%}",
             f"{every.requests:,.0f} requests, {window}"),
        card("Latency p50", _ms(every.p50_s), f"{window}, {who}"),
        card("Latency p99", _ms(every.p99_s), f"{window}, {who}"),
        card("Time to first token", _ms(every.ttft_p50_s), f"p50 of streams, {window}"),
        card("Spend today", usd(today), "UTC day, all processes"),
        card("Spend this month", usd(month), "UTC month, all processes"),
        card("Redis", badge("up", "ok") if figures.redis_ok else badge("degraded", "bad"),
             "last check of this process"),
    ], class_="cards")
    before = histogram(every.waits_before, label="Redis waits before the model call",
                       highlight=("1",))
    after = histogram(every.waits_after, label="Redis waits after the model call",
                      colour="#56B4E9", highlight=("1",))
    waits = section(
        "Redis waits per request",
        el("div", el("div", el("h3", "Before the model call"), before),
           el("div", el("h3", "After the model call"), after), class_="grid2"),
        note="triogate's signature: every check of a request shares one round trip per "
             "dependency level. With the identity cached a request waits once before the "
             "model call and once after (green bars); an established gateway waits 8 to 22 "
             f"times. Counted since each process started ({who}).")
    degraded_rows = [(check, number(count)) for check, count in sorted(figures.degraded.items())]
    hosts = {w.get("host") for w in workers}
    queues = table(
        ("Process", "Requests / s", "Error rate", "p50", "p99", "Settler queue",
         "Journal backlog", "Spend-log queue", "Degraded decisions"),
        [((f"{w.get('host')} " if len(hosts) > 1 else "") + f"pid {w.get('pid')}"
          + (" (this page)" if w.get("pid") == figures.pid and w.get("host") == stats.HOST
             else ""),
          number(w.get("rps"), 2),
          "—" if w.get("errors") is None else f"{w['errors']:.1%}",
          _ms(w.get("p50_s")), _ms(w.get("p99_s")), number(w.get("settler")),
          number(w.get("journal")), number(w.get("spend_log")), number(w.get("degraded")))
         for w in workers],
        numeric=(1, 2, 3, 4, 5, 6, 7, 8))
    accounting = section(
        "Accounting and degradation", queues,
        table(("Check", "Decisions without Redis (this process)"), degraded_rows,
              empty="No decision was taken without Redis.", numeric=(1,)),
        note="Per gateway process: post-call batches waiting for Redis, journal entries "
             "awaiting replay, spend-log rows waiting for SQL. Each process reports when it "
             "serves this page (the page refreshes itself), so with several workers every "
             "one appears within a few refreshes; rows older than a minute are dropped.")
    content = Html(cards + waits + accounting + _alerts(ctx))
    response = ctx.page("Overview", content, active="overview", refresh_s=REFRESH_S)
    # A browser keeps its connection, and so its worker: closing it after this page
    # lets the next refresh land on any worker, so every worker reports within a few.
    # (HTTP/1 only: HTTP/2 forbids the header and multiplexes anyway.)
    if str(ctx.request.scope.get("http_version", "1.1")).startswith("1"):
        response.headers["connection"] = "close"
    return response
