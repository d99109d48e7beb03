"""Spend-log queries: batched idempotent inserts, filtered pages, totals, daily sums.

Blocking functions taking an ``Engine``; :class:`~triogate.store.queries.Store` runs them
in worker threads (``_threads.py``). Every sum is over BIGINT nano-USD and comes back as
a Python ``int`` (PostgreSQL's ``sum(bigint)`` is ``numeric``: converted exactly).
"""

from __future__ import annotations

import datetime
import operator
from typing import TYPE_CHECKING, Any, Literal, final

import attrs
import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from .records import DailySpend, SpendLogRow, SpendTotals
from .schema import spend_log_tags, spend_logs

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sqlalchemy.engine import Connection, Engine

GroupBy = Literal["key", "team", "user", "end_user", "model_group", "model", "deployment"]

_GROUP_COLUMNS: Mapping[str, str] = {
    "key": "key_hash",
    "team": "team_id",
    "user": "user_id",
    "end_user": "end_user",
    "model_group": "model_group",
    "model": "upstream_model",
    "deployment": "deployment_id",
}
_MS_PER_DAY = 86_400_000
_EPOCH = datetime.date(1970, 1, 1)


@final
@attrs.frozen(kw_only=True)
class SpendFilter:
    """Which spend logs a query covers; every field narrows it, None = no condition.

    Attributes:
        start_ms: ``start_time_ms >= start_ms`` (inclusive, epoch ms).
        end_ms: ``start_time_ms < end_ms`` (exclusive, epoch ms).
        tag: rows whose tags include it exactly.
        request_id: the row of that request: its ``request_id`` (the response's
            ``x-request-id`` and ``x-litellm-call-id``) or the client's own
            ``x-request-id``.
    """

    key_hash: str | None = None
    team_id: str | None = None
    user_id: str | None = None
    end_user: str | None = None
    tag: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    request_id: str | None = None


def _where(f: SpendFilter) -> list[sa.ColumnElement[bool]]:
    c = spend_logs.c
    out: list[sa.ColumnElement[bool]] = []
    for name in ("key_hash", "team_id", "user_id", "end_user"):
        value = getattr(f, name)
        if value is not None:
            out.append(c[name] == value)
    if f.request_id is not None:
        out.append(sa.or_(c.request_id == f.request_id,
                          c.client_request_id == f.request_id))
    if f.start_ms is not None:
        out.append(c.start_time_ms >= f.start_ms)
    if f.end_ms is not None:
        out.append(c.start_time_ms < f.end_ms)
    if f.tag is not None:
        # The side table carries start_time_ms too, so (tag, time) stays one index range.
        t = spend_log_tags.c
        inner = [t.tag == f.tag]
        if f.start_ms is not None:
            inner.append(t.start_time_ms >= f.start_ms)
        if f.end_ms is not None:
            inner.append(t.start_time_ms < f.end_ms)
        out.append(c.request_id.in_(sa.select(t.request_id).where(*inner)))
    return out


def _insert(conn: Connection, table: sa.Table) -> Any:
    """An ``INSERT ... ON CONFLICT DO NOTHING`` builder for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def row_to_params(row: SpendLogRow) -> dict[str, Any]:
    """Column values of a spend-log row (tags as a JSON list)."""
    params = attrs.asdict(row, recurse=False)
    params["tags"] = list(row.tags)
    return params


#: spend_logs' columns but ``tags``, which the SQLite insert binds last (as JSON text).
_PLAIN_COLUMNS = tuple(c.name for c in spend_logs.columns if c.name != "tags")
_plain_values = operator.attrgetter(*_PLAIN_COLUMNS)
_SQLITE_INSERT = (
    f"INSERT INTO spend_logs ({', '.join(_PLAIN_COLUMNS)}, tags) "
    f"VALUES ({', '.join('?' * (len(_PLAIN_COLUMNS) + 1))}) "
    "ON CONFLICT (request_id) DO NOTHING"
)
_SQLITE_INSERT_TAGS = (
    "INSERT INTO spend_log_tags (request_id, tag, start_time_ms) VALUES (?, ?, ?) "
    "ON CONFLICT (request_id, tag) DO NOTHING"
)


def row_to_sqlite(row: SpendLogRow) -> tuple[Any, ...]:
    """A row's values in :data:`_SQLITE_INSERT`'s order: one C-level attribute fetch
    plus the tags' JSON, where SQLAlchemy's executemany ran several Python calls per
    column (the writer's thread holds the GIL meanwhile, and the event loop waits)."""
    return (*_plain_values(row), orjson.dumps(row.tags).decode())


def row_from_db(mapping: Mapping[Any, Any]) -> SpendLogRow:
    """A :class:`SpendLogRow` from a result mapping."""
    values = dict(mapping)
    values["tags"] = tuple(values.get("tags") or ())
    values["cache_hit"] = bool(values["cache_hit"])
    return SpendLogRow(**values)


def insert_spend_logs(engine: Engine, rows: Sequence[SpendLogRow]) -> int:
    """Insert rows in one transaction; rows whose request id exists are skipped.

    Returns:
        How many rows were new (a replay of a written batch returns 0).
    """
    if not rows:
        return 0
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            return _insert_sqlite(conn, rows)
        stmt = _insert(conn, spend_logs).on_conflict_do_nothing(index_elements=["request_id"])
        params = [row_to_params(r) for r in rows]
        inserted = len(conn.execute(stmt.returning(spend_logs.c.request_id),
                                    params).scalars().all())
        tag_params = [
            {"request_id": r.request_id, "tag": tag, "start_time_ms": r.start_time_ms}
            for r in rows
            for tag in dict.fromkeys(r.tags)
        ]
        if tag_params:
            conn.execute(
                _insert(conn, spend_log_tags).on_conflict_do_nothing(
                    index_elements=["request_id", "tag"]
                ),
                tag_params,
            )
    return inserted


def _insert_sqlite(conn: Connection, rows: Sequence[SpendLogRow]) -> int:
    """The SQLite insert: the driver's own executemany on tuples, one SQL text whatever
    the batch size.

    One text matters: with RETURNING, SQLAlchemy writes one multi-row VALUES text per
    batch size, and every text is a prepared statement in the connection's cache that
    keeps its last bound values (a whole batch, tags included): memory grew with each
    new batch size. sqlite3's rowcount sums the changes: skipped rows count 0.
    """
    inserted: int = conn.exec_driver_sql(_SQLITE_INSERT, [row_to_sqlite(r) for r in rows]
                                         ).rowcount
    tag_params = [(r.request_id, tag, r.start_time_ms) for r in rows if r.tags
                  for tag in dict.fromkeys(r.tags)]
    if tag_params:
        conn.exec_driver_sql(_SQLITE_INSERT_TAGS, tag_params)
    return inserted


def query_spend_logs(
    engine: Engine, f: SpendFilter, *, page: int, size: int
) -> tuple[list[SpendLogRow], int]:
    """One page of matching rows, newest first, and the number of matching rows."""
    where = _where(f)
    c = spend_logs.c
    with engine.connect() as conn:
        total = conn.execute(
            sa.select(sa.func.count()).select_from(spend_logs).where(*where)
        ).scalar_one()
        result = conn.execute(
            sa.select(spend_logs)
            .where(*where)
            .order_by(c.start_time_ms.desc(), c.request_id.desc())
            .limit(size)
            .offset((page - 1) * size)
        )
        return [row_from_db(m) for m in result.mappings()], int(total)


def spend_totals(engine: Engine, f: SpendFilter) -> SpendTotals:
    """Request count and sums of tokens and cost over the matching rows."""
    c = spend_logs.c

    def total(col: sa.ColumnElement[int]) -> sa.ColumnElement[int]:
        return sa.func.coalesce(sa.func.sum(col), 0)

    stmt = sa.select(
        sa.func.count(), total(c.input_tokens), total(c.output_tokens), total(c.cost_nanousd)
    ).where(*_where(f))
    with engine.connect() as conn:
        requests, input_tokens, output_tokens, cost = conn.execute(stmt).one()
    return SpendTotals(
        requests=int(requests),
        input_tokens=int(input_tokens),
        output_tokens=int(output_tokens),
        cost_nanousd=int(cost),
    )


def day_of(epoch_ms: int) -> str:
    """The UTC day of an epoch-ms time, ``"YYYY-MM-DD"``."""
    return (_EPOCH + datetime.timedelta(days=epoch_ms // _MS_PER_DAY)).isoformat()


def daily_spend(engine: Engine, f: SpendFilter, *, group_by: GroupBy) -> list[DailySpend]:
    """Sums per UTC day and group, ordered by day then group id (None first)."""
    try:
        group = spend_logs.c[_GROUP_COLUMNS[group_by]]
    except KeyError:
        raise ValueError(
            f"group_by must be one of {sorted(_GROUP_COLUMNS)}, not {group_by!r}"
        ) from None
    c = spend_logs.c
    # Integer division of a BIGINT by an integer: the day number on both dialects.
    day = (c.start_time_ms // _MS_PER_DAY).label("day")
    stmt = (
        sa.select(
            day,
            group.label("group_id"),
            sa.func.count().label("requests"),
            sa.func.sum(c.input_tokens).label("input_tokens"),
            sa.func.sum(c.output_tokens).label("output_tokens"),
            sa.func.sum(c.cost_nanousd).label("cost_nanousd"),
        )
        .where(*_where(f))
        .group_by(day, group)
    )
    with engine.connect() as conn:
        found = conn.execute(stmt).all()
    out = [
        DailySpend(
            day=(_EPOCH + datetime.timedelta(days=int(r.day))).isoformat(),
            group_id=r.group_id,
            requests=int(r.requests),
            input_tokens=int(r.input_tokens),
            output_tokens=int(r.output_tokens),
            cost_nanousd=int(r.cost_nanousd),
        )
        for r in found
    ]
    out.sort(key=lambda d: (d.day, d.group_id is not None, d.group_id or ""))
    return out


def spend_breakdown(engine: Engine, f: SpendFilter, *, columns: Sequence[GroupBy],
                    by_day: bool) -> list[dict[str, Any]]:
    """Sums of tokens and cost per distinct value of ``columns`` (and UTC day): each
    row a dict with the columns' names, ``day`` (``"YYYY-MM-DD"``, when ``by_day``),
    ``requests``, ``input_tokens``, ``output_tokens`` and ``cost_nanousd``, ordered by
    day, then cost (largest first)."""
    c = spend_logs.c
    keys = [spend_logs.c[_GROUP_COLUMNS[name]].label(name) for name in columns]
    if by_day:
        keys.insert(0, (c.start_time_ms // _MS_PER_DAY).label("day"))
    stmt = (
        sa.select(
            *keys,
            sa.func.count().label("requests"),
            sa.func.sum(c.input_tokens).label("input_tokens"),
            sa.func.sum(c.output_tokens).label("output_tokens"),
            sa.func.sum(c.cost_nanousd).label("cost_nanousd"),
        )
        .where(*_where(f))
        .group_by(*keys)
    )
    with engine.connect() as conn:
        found = [dict(m) for m in conn.execute(stmt).mappings()]
    for row in found:
        for name in ("requests", "input_tokens", "output_tokens", "cost_nanousd"):
            row[name] = int(row[name])
        if by_day:
            row["day"] = (_EPOCH + datetime.timedelta(days=int(row["day"]))).isoformat()
    found.sort(key=lambda r: (r.get("day", ""), -r["cost_nanousd"],
                              *(str(r[n] or "") for n in columns)))
    return found


def _sums(c: Any) -> list[sa.ColumnElement[Any]]:
    """Request count and the sums of tokens and cost, labelled as the breakdowns name them."""
    return [
        sa.func.count().label("requests"),
        sa.func.sum(c.input_tokens).label("input_tokens"),
        sa.func.sum(c.output_tokens).label("output_tokens"),
        sa.func.sum(c.cost_nanousd).label("cost_nanousd"),
    ]


def _ints(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sums as Python ints (PostgreSQL's ``sum(bigint)`` is ``numeric``)."""
    for row in rows:
        for name in ("requests", "input_tokens", "output_tokens", "cost_nanousd"):
            row[name] = int(row[name])
    return rows


def top_spend(engine: Engine, f: SpendFilter, *, column: GroupBy, limit: int | None,
              skip_empty: bool = False) -> list[dict[str, Any]]:
    """Sums per distinct value of ``column``, largest cost first (ties by value), at most
    ``limit`` rows (None: all): each a dict with ``column``'s name and the sums of
    :func:`spend_breakdown`. ``skip_empty`` leaves out rows without a value (None or
    ``""``), as LiteLLM's ``model != ''``."""
    c = spend_logs.c
    group = c[_GROUP_COLUMNS[column]]
    where = _where(f)
    if skip_empty:
        where += [group.is_not(None), group != ""]
    cost = sa.func.sum(c.cost_nanousd)
    stmt = (
        sa.select(group.label(column), *_sums(c))
        .where(*where)
        .group_by(group)
        .order_by(cost.desc(), group.asc())
    )
    if limit is not None:
        stmt = stmt.limit(limit)
    with engine.connect() as conn:
        return _ints([dict(m) for m in conn.execute(stmt).mappings()])


def tag_spend(engine: Engine, f: SpendFilter, *, tags: Sequence[str] | None
              ) -> list[dict[str, Any]]:
    """Sums per request tag over the matching rows (a request counts once under each of
    its tags), largest cost first, then by tag: each a dict with ``tag`` and the sums of
    :func:`spend_breakdown`. ``tags`` keeps only those tags (None: every tag)."""
    c = spend_logs.c
    t = spend_log_tags.c
    where = _where(f)
    # The side table's own copy of the time keeps (tag, time) one index range.
    if f.start_ms is not None:
        where.append(t.start_time_ms >= f.start_ms)
    if f.end_ms is not None:
        where.append(t.start_time_ms < f.end_ms)
    if tags is not None:
        where.append(t.tag.in_(list(tags)))
    cost = sa.func.sum(c.cost_nanousd)
    stmt = (
        sa.select(t.tag.label("tag"), *_sums(c))
        .select_from(spend_log_tags.join(spend_logs, t.request_id == c.request_id))
        .where(*where)
        .group_by(t.tag)
        .order_by(cost.desc(), t.tag.asc())
    )
    with engine.connect() as conn:
        return _ints([dict(m) for m in conn.execute(stmt).mappings()])
