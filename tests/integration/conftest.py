"""SQL fixtures: a store on SQLite and on PostgreSQL, each test on an empty database.

PostgreSQL comes from ``TRIOGATE_TEST_DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; tests on it are skipped (with the reason)
only when it cannot be reached. Each test gets a fresh schema (selected through the
URL's ``options=-csearch_path=...``), dropped afterwards, so tests never collide.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Literal

import attrs
import psycopg
import pytest
import sqlalchemy as sa
import trio

from triogate.store import open_store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from triogate.store import Store

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _libpq_url(url: str) -> str:
    """The URL for psycopg itself (SQLAlchemy's ``+driver`` suffix removed)."""
    parsed = sa.engine.make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_base_url() -> str:
    """The test PostgreSQL server's URL; skips the test when it cannot be reached."""
    url = os.environ.get("TRIOGATE_TEST_DATABASE_URL") or DEFAULT_POSTGRES_URL
    try:
        psycopg.connect(_libpq_url(url), connect_timeout=3).close()
    except psycopg.Error as exc:
        shown = sa.engine.make_url(url).render_as_string(hide_password=True)
        pytest.skip(
            f"PostgreSQL unreachable at {shown} ({type(exc).__name__}); "
            "set TRIOGATE_TEST_DATABASE_URL to a reachable server to run these tests"
        )
    return url


@attrs.frozen(kw_only=True)
class SqlTarget:
    """Where a test's store lives: pass ``url`` and ``state_dir`` to ``open_store``."""

    dialect: Literal["sqlite", "postgresql"]
    url: str | None
    state_dir: Path
    schema: str | None = None


def _schema_url(base: str, schema: str) -> str:
    parsed = sa.engine.make_url(base)
    query = dict(parsed.query)
    query["options"] = f"-csearch_path={schema}"
    return parsed.set(query=query).render_as_string(hide_password=False)


@pytest.fixture
def postgres_target(postgres_base_url: str, tmp_path: Path) -> Iterator[SqlTarget]:
    """A fresh, empty PostgreSQL schema for one test (dropped after it)."""
    schema = f"tg_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq_url(postgres_base_url), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield SqlTarget(
            dialect="postgresql",
            url=_schema_url(postgres_base_url, schema),
            state_dir=tmp_path / "state",
            schema=schema,
        )
    finally:
        with psycopg.connect(_libpq_url(postgres_base_url), autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_target(request: pytest.FixtureRequest, tmp_path: Path) -> SqlTarget:
    """Each test that uses it runs twice: the default SQLite file, then PostgreSQL."""
    if request.param == "sqlite":
        return SqlTarget(dialect="sqlite", url=None, state_dir=tmp_path / "state")
    return request.getfixturevalue("postgres_target")  # type: ignore[no-any-return]


@attrs.define
class FakeWallClock:
    """An epoch-ms clock the test moves by hand (the store's ``now_ms``)."""

    now_ms: int = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def wall_clock() -> FakeWallClock:
    return FakeWallClock()


@pytest.fixture
async def store(sql_target: SqlTarget, wall_clock: FakeWallClock) -> AsyncIterator[Store]:
    """An open store on an empty database (both dialects)."""
    with trio.fail_after(30):
        async with open_store(
            sql_target.url, state_dir=sql_target.state_dir, now_ms=wall_clock
        ) as s:
            yield s


# --------------------------------------------------------------------------- a TCP proxy


class TcpProxy:
    """A TCP proxy on 127.0.0.1 that a test can take down and bring back on the same port.

    Down closes the listener and every proxied connection: to the store, the database
    is unreachable (connection refused), as when the server restarts.
    """

    def __init__(self, nursery: trio.Nursery, target_host: str, target_port: int) -> None:
        self._nursery = nursery
        self._target = (target_host, target_port)
        self.port = 0
        self._scope: trio.CancelScope | None = None
        self._flowing = trio.Event()
        self._flowing.set()

    async def up(self) -> None:
        """Listen (on the same port as before, if it was up before)."""
        assert self._scope is None
        self._scope = await self._nursery.start(self._serve)

    def stall(self) -> None:
        """Keep every connection open but forward nothing (a silent network)."""
        if self._flowing.is_set():
            self._flowing = trio.Event()

    def resume(self) -> None:
        """Forward again after :meth:`stall`."""
        self._flowing.set()

    def down(self) -> None:
        """Stop listening and cut every connection."""
        assert self._scope is not None
        self._scope.cancel()
        self._scope = None

    async def _serve(self, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            self.port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._handle, listeners)
                task_status.started(scope)

    async def _open_upstream(self) -> trio.SocketStream:
        return await trio.open_tcp_stream(*self._target)

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client, await self._open_upstream() as upstream:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                while data := await src.receive_some(65536):
                    await self._flowing.wait()
                    await dst.send_all(data)
                await dst.send_eof()

            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pump, client, upstream)
                    nursery.start_soon(pump, upstream, client)
            except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # one side hung up: the connection is over

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        parsed = sa.engine.make_url(url)
        return parsed.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)


@pytest.fixture
async def postgres_proxy(postgres_target: SqlTarget) -> AsyncIterator[tuple[TcpProxy, str]]:
    """A proxy to the test PostgreSQL (up) and the test schema's URL through it."""
    assert postgres_target.url is not None
    parsed = sa.engine.make_url(postgres_target.url)
    async with trio.open_nursery() as nursery:
        proxy = TcpProxy(nursery, parsed.host or "127.0.0.1", parsed.port or 5432)
        await proxy.up()
        yield proxy, proxy.url_for(postgres_target.url)
        nursery.cancel_scope.cancel()
