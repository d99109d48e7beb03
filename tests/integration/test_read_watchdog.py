"""The run's read watchdog (``providers/watchdog.py``) over a loopback socket pair, on
trio's MockClock: a body wait fails at exactly its timeout, as the deadline scope per
read it replaces did; a stream that keeps sending never does; closed bodies leave."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from triogate.providers import http1
from triogate.providers import watchdog as watchdog_module
from triogate.providers.http1 import UpstreamConnection
from triogate.providers.watchdog import watchdog

if TYPE_CHECKING:
    from trio.testing import MockClock

pytestmark = pytest.mark.integration


def _pair() -> tuple[UpstreamConnection, trio.socket.SocketType]:
    """A plain upstream connection, and the peer's socket to write with."""
    sock, peer = trio.socket.socketpair()
    conn = UpstreamConnection((b"http", b"x", 80), trio.SocketStream(sock), sock)
    return conn, peer


async def test_a_wait_longer_than_the_timeout_fails_at_exactly_the_timeout(
    autojump_clock: MockClock,
) -> None:
    conn, peer = _pair()
    with peer:
        watch = watchdog().watch(conn.fd, 5.0)
        await trio.sleep(3)  # not waiting: nothing times out, however long
        await peer.send(b"one")
        assert await conn.receive_watched(watch, None) == b"one"
        start = trio.current_time()
        with pytest.raises(httpx.ReadTimeout, match="upstream read timed out"):
            await conn.receive_watched(watch, None)
        assert trio.current_time() - start == 5.0
        assert watch.fired and watch.closed
        await conn.close()


async def test_a_stream_that_keeps_sending_is_never_timed_out(
    autojump_clock: MockClock,
) -> None:
    conn, peer = _pair()
    with peer:
        watch = watchdog().watch(conn.fd, 5.0)

        async def send_every_4_s() -> None:
            for i in range(30):  # 2 minutes, each gap shorter than the timeout
                await trio.sleep(4.0)
                await peer.send(b"%d;" % i)

        got = b""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_every_4_s)
            while not got.endswith(b"29;"):
                got += await conn.receive_watched(watch, None)
        assert not watch.fired
        assert trio.current_time() == 120.0
        watchdog().unwatch(watch)
        await conn.close()


async def test_bytes_that_arrive_as_it_fires_win(autojump_clock: MockClock) -> None:
    # The watchdog fired (the wait had lasted its timeout) but the bytes were there in the
    # same pass: the read returns them and the body is watched again.
    conn, peer = _pair()
    with peer:
        dog = watchdog()
        watch = dog.watch(conn.fd, 5.0)
        watch.since = trio.current_time()
        dog._expire(trio.current_time() + 5.0)  # what the watchdog does when due
        watch.since = float("inf")
        assert watch.fired
        await peer.send(b"late")
        assert await conn.receive_watched(watch, None) == b"late"
        assert not watch.fired and not watch.closed
        start = trio.current_time()
        with pytest.raises(httpx.ReadTimeout):  # and it still times out later
            await conn.receive_watched(watch, None)
        assert trio.current_time() - start == 5.0
        await conn.close()


async def test_closed_bodies_leave_the_heap(autojump_clock: MockClock) -> None:
    dog = watchdog()
    watches = [dog.watch(1000 + i, 600.0) for i in range(3 * watchdog_module._PRUNE_SLACK)]
    for watch in watches:
        dog.unwatch(watch)
    assert len(dog._heap) <= watchdog_module._PRUNE_SLACK + 1
    await trio.sleep(601)  # the rest are dropped when due
    assert dog._heap == []


class _Pacer:
    behind = False


async def _extra_passes(conn: UpstreamConnection, peer: trio.socket.SocketType,
                        monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The passes each of three reads that find bytes waiting yields before reading."""
    watch = watchdog().watch(conn.fd, 5.0)
    calls = 0
    checkpoint = trio.lowlevel.checkpoint

    async def counted() -> None:
        nonlocal calls
        calls += 1
        await checkpoint()

    passes = []
    with monkeypatch.context() as patch:
        patch.setattr(trio.lowlevel, "checkpoint", counted)
        for _ in range(3):
            await peer.send(b"x")
            await trio.sleep(0.01)  # here before the read
            before = calls
            assert await conn.receive_watched(watch, None) == b"x"
            passes.append(calls - before)
    watchdog().unwatch(watch)
    return passes


async def test_a_read_behind_takes_one_more_pass_unless_the_pacer_holds_the_streams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read after one that found bytes waiting yields one more pass first (more may
    arrive); not while the run's pacer holds streams between reads (that read follows a
    window's wait already)."""
    pacer = _Pacer()
    http1.set_pacer(pacer)
    conn, peer = _pair()
    with peer:
        assert await _extra_passes(conn, peer, monkeypatch) == [0, 1, 1]
        pacer.behind = True
        conn.behind = False
        assert await _extra_passes(conn, peer, monkeypatch) == [0, 0, 0]
        await conn.close()
