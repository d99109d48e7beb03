"""The dashboard's spend queries: the admin API's filters plus model, status and cache hit,
and daily sums by tag as well as by key, team, user and model.

Read-only SQLAlchemy Core over the store's tables, run in a worker thread like every
store call (the store's engine; SQL errors become :class:`~triogate.errors.StoreError`).
Sums are integer nano-USD, exact on both databases.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, final

import attrs
import sqlalchemy as sa
import sqlalchemy.exc
import trio

from triogate.errors import StoreError
from triogate.store.queries_spend import row_from_db
from triogate.store.schema import spend_log_tags, spend_logs

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Engine

    from triogate.store import SpendLogRow, Store

MS_PER_DAY = 86_400_000
GROUPS = {"key": "key_hash", "team": "team_id", "user": "user_id", "model": "model_group",
          "tag": "tag"}


@final
@attrs.frozen(kw_only=True)
class LogFilter:
    """Which spend-log rows a page, a chart or an export covers (None = any)."""

    start_ms: int | None = None
    end_ms: int | None = None
    key_hash: str | None = None
    key_alias: str | None = None
    team_id: str | None = None
    user_id: str | None = None
    end_user: str | None = None
    model_group: str | None = None
    status: str | None = None
    cache_hit: bool | None = None
    tag: str | None = None


def _where(f: LogFilter) -> list[sa.ColumnElement[bool]]:
    c = spend_logs.c
    out: list[sa.ColumnElement[bool]] = []
    for name in ("key_hash", "key_alias", "team_id", "user_id", "end_user", "model_group",
                 "status", "cache_hit"):
        value = getattr(f, name)
        if value is not None:
            out.append(c[name] == value)
    if f.start_ms is not None:
        out.append(c.start_time_ms >= f.start_ms)
    if f.end_ms is not None:
        out.append(c.start_time_ms < f.end_ms)
    if f.tag is not None:
        t = spend_log_tags.c
        out.append(c.request_id.in_(sa.select(t.request_id).where(t.tag == f.tag)))
    return out


def _page(engine: Engine, f: LogFilter, page: int, size: int) -> tuple[list[SpendLogRow], int]:
    c = spend_logs.c
    with engine.connect() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(spend_logs)
                             .where(*_where(f))).scalar_one()
        rows = conn.execute(sa.select(spend_logs).where(*_where(f))
                            .order_by(c.start_time_ms.desc(), c.request_id.desc())
                            .limit(size).offset((page - 1) * size))
        return [row_from_db(m) for m in rows.mappings()], int(total)


def _daily(engine: Engine, f: LogFilter, group_by: str) -> list[tuple[str, str | None, int, int]]:
    c = spend_logs.c
    day = (c.start_time_ms // MS_PER_DAY).label("day")
    if group_by == "tag":
        t = spend_log_tags.c
        group: Any = t.tag
        source: Any = spend_logs.join(spend_log_tags, t.request_id == c.request_id)
    else:
        group = c[GROUPS[group_by]]
        source = spend_logs
    stmt = (sa.select(day, group.label("g"), sa.func.count(), sa.func.sum(c.cost_nanousd))
            .select_from(source).where(*_where(f)).group_by(day, group))
    with engine.connect() as conn:
        found = conn.execute(stmt).all()
    epoch = datetime.date(1970, 1, 1)
    out = [((epoch + datetime.timedelta(days=int(r[0]))).isoformat(), r[1], int(r[2]),
            int(r[3] or 0)) for r in found]
    # Rows without the group (no team, no user) sort last in their day: None and str
    # do not compare.
    out.sort(key=lambda r: (r[0], r[1] is None, r[1] or ""))
    return out


def _sum(engine: Engine, f: LogFilter) -> tuple[int, int, int]:
    c = spend_logs.c
    with engine.connect() as conn:
        n, tokens, cost = conn.execute(sa.select(
            sa.func.count(),
            sa.func.coalesce(sa.func.sum(c.input_tokens + c.output_tokens), 0),
            sa.func.coalesce(sa.func.sum(c.cost_nanousd), 0)).where(*_where(f))).one()
    return int(n), int(tokens), int(cost)


async def _run(op: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return await trio.to_thread.run_sync(fn, *args)
    except (sqlalchemy.exc.SQLAlchemyError, OSError) as exc:
        raise StoreError(f"{op} failed: {type(exc).__name__}") from exc


async def log_page(store: Store, f: LogFilter, *, page: int, size: int
                   ) -> tuple[list[SpendLogRow], int]:
    """A page of rows, newest first, and how many match. A checkpoint."""
    result: tuple[list[SpendLogRow], int] = await _run("spend log page", _page, store.engine,
                                                       f, page, size)
    return result


async def daily(store: Store, f: LogFilter, *, group_by: str
                ) -> list[tuple[str, str | None, int, int]]:
    """``(day, group, requests, cost_nanousd)`` per UTC day and group. A checkpoint."""
    if group_by not in GROUPS:
        raise ValueError(f"group_by must be one of {sorted(GROUPS)}")
    result: list[tuple[str, str | None, int, int]] = await _run(
        "daily spend", _daily, store.engine, f, group_by)
    return result


async def total(store: Store, f: LogFilter) -> tuple[int, int, int]:
    """``(requests, tokens, cost_nanousd)`` over the matching rows. A checkpoint."""
    result: tuple[int, int, int] = await _run("spend total", _sum, store.engine, f)
    return result


def day_start_ms(now_ms: int) -> int:
    return now_ms - now_ms % MS_PER_DAY


def month_start_ms(now_ms: int) -> int:
    today = datetime.datetime.fromtimestamp(now_ms / 1000, datetime.UTC).date()
    first = datetime.datetime(today.year, today.month, 1, tzinfo=datetime.UTC)
    return int(first.timestamp() * 1000)


def series(rows: list[tuple[str, str | None, int, int]], days: list[str],
           name: Callable[[str | None], str]) -> dict[str, list[float]]:
    """Daily rows → ``{group name: [USD per day]}`` aligned on ``days``."""
    index = {d: i for i, d in enumerate(days)}
    out: dict[str, list[float]] = {}
    for day, group, _, cost in rows:
        if day in index:
            out.setdefault(name(group), [0.0] * len(days))[index[day]] += cost / 1e9
    return out


def day_range(end_ms: int, days: int) -> list[str]:
    """The ``days`` UTC days ending with the one holding ``end_ms``."""
    last = datetime.datetime.fromtimestamp(end_ms / 1000, datetime.UTC).date()
    return [(last - datetime.timedelta(days=days - 1 - i)).isoformat() for i in range(days)]
