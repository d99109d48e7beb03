"""Shared fixtures. The rules are in tests/README.md."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import RespBackend
from triogate.redis_server import SyncServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from trio.testing import MockClock


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
