"""Engines for the store: URL parsing, per-dialect pools and pragmas, schema creation.

Blocking code, called from worker threads (``create_schema``) or at open (parsing and
building the engine, which does not connect).
"""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
import sqlalchemy.exc

from triogate.errors import StoreError

from .migrate import upgrade
from .schema import metadata

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.engine import URL, Engine

_SQLITE_BUSY_TIMEOUT_MS = 10_000
_PG_POOL_SIZE = 5
_PG_MAX_OVERFLOW = 5
_PG_CONNECT_TIMEOUT_S = 5
#: Server-side bound on any one statement (a lock wait included); the URL may set its
#: own (``?options=-c statement_timeout=...``).
_PG_STATEMENT_TIMEOUT_MS = 30_000
#: Waiting for a free pooled connection (SQLAlchemy's default is 30 s).
_PG_POOL_TIMEOUT_S = 10
#: Unacknowledged data or silent keep-alives for this long drop the connection (a peer
#: gone without a FIN), instead of the kernel's ~15 minutes of retransmissions.
_PG_TCP_USER_TIMEOUT_MS = 30_000
#: pg_advisory_xact_lock id that serialises schema creation across processes.
_SCHEMA_LOCK_ID = 0x7472696F67617465 & 0x7FFFFFFFFFFFFFFF  # "triogate"


def wall_clock_ms() -> int:
    """Epoch milliseconds from the system clock (the default ``now_ms`` of a store)."""
    return time.time_ns() // 1_000_000


def parse_url(database_url: str | None, state_dir: Path) -> URL:
    """The SQLAlchemy URL: ``postgres(ql)://`` → psycopg 3, None → the state folder's file.

    Raises:
        StoreError: not a URL, or not a database triogate supports (no password shown).
    """
    if database_url is None:
        return sa.engine.URL.create("sqlite", database=str(state_dir / "triogate.db"))
    try:
        url = sa.engine.make_url(database_url)
    except sqlalchemy.exc.ArgumentError:
        # Its message quotes the URL, password included: say only what was wrong.
        raise StoreError("database_url is not a valid URL") from None
    backend = url.get_backend_name()
    if backend in ("postgres", "postgresql"):
        return url.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        return url.set(drivername="sqlite")
    raise StoreError(
        f"unsupported database_url scheme {backend!r}: use sqlite:///PATH or postgresql://..."
    )


def make_engine(url: URL) -> tuple[Engine, int]:
    """The engine and how many threads may use it at once (its pool's size)."""
    if url.get_backend_name() == "postgresql":
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in url.query:
            connect_args["connect_timeout"] = _PG_CONNECT_TIMEOUT_S
        if "application_name" not in url.query:
            connect_args["application_name"] = "triogate"
        for name, value in (("keepalives", 1), ("keepalives_idle", 10),
                            ("keepalives_interval", 5), ("keepalives_count", 3),
                            ("tcp_user_timeout", _PG_TCP_USER_TIMEOUT_MS)):
            if name not in url.query:
                connect_args[name] = value
        url = with_statement_timeout(url, _PG_STATEMENT_TIMEOUT_MS)
        engine = sa.create_engine(
            url,
            pool_size=_PG_POOL_SIZE,
            max_overflow=_PG_MAX_OVERFLOW,
            pool_timeout=_PG_POOL_TIMEOUT_S,
            pool_pre_ping=True,
            pool_recycle=1800,
            connect_args=connect_args,
        )
        return engine, _PG_POOL_SIZE + _PG_MAX_OVERFLOW
    memory = url.database in (None, "", ":memory:")
    engine = sa.create_engine(
        url,
        # A memory database exists per connection: share one, one thread at a time.
        poolclass=sa.pool.StaticPool if memory else sa.pool.QueuePool,
        connect_args={"check_same_thread": False},
    )
    sa.event.listen(engine, "connect", _sqlite_on_connect)
    return engine, 1 if memory else 5


def with_statement_timeout(url: URL, timeout_ms: int) -> URL:
    """``url`` whose libpq ``options`` set ``statement_timeout`` (kept if already set),
    beside any other options it has (a ``search_path``...)."""
    options = url.query.get("options", "")
    if isinstance(options, tuple):  # given twice: libpq would take the last
        options = options[-1] if options else ""
    if "statement_timeout" in options:
        return url
    options = f"{options} -c statement_timeout={timeout_ms}".strip()
    return url.update_query_dict({"options": options})


def _sqlite_on_connect(dbapi_connection: Any, _record: object) -> None:
    """Per connection: busy timeout, WAL, and NORMAL sync (safe with WAL).

    Runs in a worker thread (the engine is only used from them), so it may sleep.
    """
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_TIMEOUT_MS}")
        # Switching a new database to WAL needs an exclusive lock, and SQLite reports
        # "database is locked" at once (no busy handler) while another connection
        # opens it: retry briefly. The mode is persistent: later connections find it.
        deadline = time.monotonic() + _SQLITE_BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                cursor.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def create_schema(engine: Engine) -> None:
    """``create_all``, safe when several processes start at once.

    Both dialects run the check-then-create inside one transaction that holds a lock
    other creators wait for: PostgreSQL a transaction-scoped advisory lock, SQLite the
    database's write lock (``BEGIN IMMEDIATE``; its DDL is transactional, but the
    sqlite3 module would not begin a transaction before DDL by itself). A creator that
    waited then finds every table and creates nothing.
    """
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_SCHEMA_LOCK_ID)))
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        metadata.create_all(conn)
        upgrade(conn)
        conn.commit()
