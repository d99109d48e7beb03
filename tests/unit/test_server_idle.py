"""The server's keep-alive watchdog (``server/_idle.py``) on trio's MockClock: an idle
connection's timer is cancelled at exactly ``keep_alive_s`` after it began to idle, as the
deadline it replaces would have been; a busy one, or one that idled again later, is not;
an ended one is forgotten."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from triogate.server._idle import Idle, IdleWatchdog

if TYPE_CHECKING:
    from trio.testing import MockClock


async def idle_until_cancelled(conn: Idle, closed: list[float]) -> None:
    with conn.timer:
        conn.since = trio.current_time()
        await trio.sleep_forever()
    closed.append(trio.current_time())


async def test_idle_connections_close_at_exactly_the_keep_alive(
    autojump_clock: MockClock,
) -> None:
    dog = IdleWatchdog(5.0)
    busy, late, ended = Idle(), Idle(), Idle()
    closed: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dog.run)
        for conn in (busy, late, ended):
            dog.watch(conn)
        await trio.sleep(12.5)  # busy all along (since is inf): never closed
        assert not busy.timer.cancel_called
        start = trio.current_time()
        nursery.start_soon(idle_until_cancelled, busy, closed)
        await trio.sleep(3)
        nursery.start_soon(idle_until_cancelled, late, closed)
        ended.closed = True
        ended.since = 0.0  # idle "for ever", but closed: left alone
        await trio.sleep(10)
        assert closed == [start + 5.0, start + 8.0]
        assert not ended.timer.cancel_called
        nursery.cancel_scope.cancel()


async def test_without_a_keep_alive_nothing_is_watched(autojump_clock: MockClock) -> None:
    dog = IdleWatchdog(0)
    conn = Idle()
    dog.watch(conn)  # the connection closes itself when it idles (its own deadline)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dog.run)
        await trio.sleep(100)
        assert not conn.timer.cancel_called
        nursery.cancel_scope.cancel()
