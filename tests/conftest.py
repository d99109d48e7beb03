"""Shared fixtures. The rules are in tests/README.md."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import trio

from tests.blocking import Guard
from triogate.batch import RespBackend
from triogate.redis_server import SyncServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from trio.testing import MockClock


_GUARD = Guard()


@pytest.fixture(scope="session", autouse=True)
def _blocking_guard() -> Iterator[Guard]:
    """The loop-blocking guard (tests/blocking.py), installed for the whole session."""
    _GUARD.install()
    try:
        yield _GUARD
    finally:
        _GUARD.uninstall()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fails a test during which a Trio loop's thread slept, opened a file or waited on a
    blocking socket (``@pytest.mark.allow_blocking("why")`` exempts one). Trio fixtures run
    inside the test's call, so their blocking counts too."""
    _GUARD.take()
    try:
        result = yield
    finally:
        found = _GUARD.take()
    if found and item.get_closest_marker("allow_blocking") is None:
        lines = "\n".join(f"  {b}" for b in dict.fromkeys(found))
        pytest.fail(f"the Trio loop was blocked {len(found)} time(s):\n{lines}", pytrace=False)
    return result


@pytest.fixture
def autojump_clock() -> MockClock:
    """A MockClock that jumps whenever every task is blocked: for pure unit tests only."""
    from trio.testing import MockClock

    return MockClock(autojump_threshold=0)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncServer | None]:
    """A private Redis-compatible server for the session (None if TRIOGATE_TEST_REDIS_URL)."""
    if os.environ.get("TRIOGATE_TEST_REDIS_URL"):
        yield None
        return
    server = SyncServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: SyncServer | None) -> str:
    """The URL of the test server: TRIOGATE_TEST_REDIS_URL when set, else the embedded one."""
    return os.environ.get("TRIOGATE_TEST_REDIS_URL") or redis_server.url  # type: ignore[union-attr]


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[RespBackend]:
    """A fresh client on an empty database (FLUSHALL and SCRIPT FLUSH first)."""
    backend = RespBackend(redis_url, name="redis", command_timeout_s=5.0)
    with trio.fail_after(10):
        await backend.execute([("FLUSHALL",), ("SCRIPT", "FLUSH")])
    try:
        yield backend
    finally:
        await backend.aclose()
