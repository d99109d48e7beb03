"""Pooled connections the server closed while they sat idle (its ``timeout``, ``CLIENT
KILL``): the pool notices before reuse, or retries once on a fresh connection; no round
fails."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import RespBackend
from triogate.batch._resp import _Connection

if TYPE_CHECKING:
    from tests.chaos.conftest import KillableServer

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

POOL = 8


async def fill_pool(backend: RespBackend) -> None:
    """Open ``POOL`` connections at once (a round each), so that all of them go idle."""
    async def one(i: int) -> None:
        assert await backend.execute([("SET", f"k{i}", i), ("BLPOP", "never", "0.05")])

    async with trio.open_nursery() as nursery:
        for i in range(POOL):
            nursery.start_soon(one, i)
    assert backend.statistics().connections_idle == POOL


async def wait_until_only_me(admin: RespBackend) -> None:
    """Poll (with a deadline) until the server lists no client but ``admin``'s own."""
    with trio.fail_after(10):
        while True:
            (listing,) = await admin.execute([("CLIENT", "LIST", "TYPE", "normal")])
            assert isinstance(listing, bytes)
            if len(listing.strip().splitlines()) == 1:
                return
            await trio.sleep(0.1)


async def every_round_succeeds(backend: RespBackend) -> None:
    async def one(i: int) -> None:
        assert await backend.execute([("GET", f"k{i}")]) == [str(i).encode()]

    async with trio.open_nursery() as nursery:
        for i in range(POOL):
            nursery.start_soon(one, i)


@pytest.mark.parametrize("how", ["server timeout", "client kill"])
async def test_connections_closed_while_idle_cost_no_round(
    killable_server: KillableServer, how: str
) -> None:
    backend = RespBackend(killable_server.url, pool_size=POOL, command_timeout_s=2.0)
    admin = RespBackend(killable_server.url, pool_size=1)
    with trio.fail_after(30):
        await fill_pool(backend)
        if how == "server timeout":
            await admin.execute([("CONFIG", "SET", "timeout", "1")])
        else:
            await admin.execute([("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")])
        await wait_until_only_me(admin)
        await every_round_succeeds(backend)
    stats = backend.statistics()
    assert stats.failures == 0
    assert stats.stale_discarded + stats.stale_retries >= POOL
    await backend.aclose()
    await admin.aclose()


async def test_a_connection_closed_after_the_check_is_retried_once_on_a_fresh_one(
    killable_server: KillableServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race the pre-use check cannot see: the server closes the connection just after
    # it was checked. Without the check, every reuse meets a closed connection.
    monkeypatch.setattr(_Connection, "looks_closed", lambda self: False)
    backend = RespBackend(killable_server.url, pool_size=POOL, command_timeout_s=2.0)
    admin = RespBackend(killable_server.url, pool_size=1)
    with trio.fail_after(30):
        await fill_pool(backend)
        await admin.execute([("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")])
        await wait_until_only_me(admin)
        await every_round_succeeds(backend)
    stats = backend.statistics()
    assert (stats.failures, stats.stale_retries) == (0, POOL)
    await backend.aclose()
    await admin.aclose()


async def test_connections_idle_past_max_idle_are_not_reused(
    killable_server: KillableServer,
) -> None:
    backend = RespBackend(killable_server.url, pool_size=POOL, max_idle_s=0.2)
    with trio.fail_after(30):
        await fill_pool(backend)
        await trio.sleep(0.3)
        await every_round_succeeds(backend)
    stats = backend.statistics()
    assert stats.stale_discarded == POOL and stats.stale_retries == 0
    await backend.aclose()
