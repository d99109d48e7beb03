"""The Redis client's pipeline bound under the run's watchdog (``batch/_watchdog.py``):
a pipeline on a pooled connection fails at exactly ``command_timeout_s`` after its
``execute`` began, as with the deadline scope it replaces, and its connection is never
reused; one that waits for a pool slot is bounded alike (by a scope); a connection that
idled for long is not timed out early. A scripted RESP server on a unix socket, on trio's
MockClock."""

from __future__ import annotations

import socket
import threading
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import hiredis
import pytest
import trio

from triogate.batch import BackendUnavailable, RespBackend
from triogate.batch._resp import _Connection

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from trio.testing import MockClock

pytestmark = pytest.mark.integration


class ScriptedServer:
    """Answers ``+OK`` to every command after ``delay_s``, or never while ``silent``;
    reads nothing while not ``reading``."""

    def __init__(self) -> None:
        self.silent = False
        self.reading = True
        self.delay_s = 0.0
        self.connections = 0

    async def serve(self, listener: trio.SocketListener) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                self.connections += 1
                nursery.start_soon(self._one, stream)

    async def _one(self, stream: trio.SocketStream) -> None:
        reader = hiredis.Reader()
        async with stream:
            while True:
                while not self.reading:
                    await trio.sleep(0.1)
                data = await stream.receive_some(65536)
                if not data:
                    break
                reader.feed(data)
                count = 0
                while reader.gets() is not False:
                    count += 1
                if self.silent:
                    continue
                await trio.sleep(self.delay_s)
                await stream.send_all(b"+OK\r\n" * count)


@asynccontextmanager
async def served(tmp_path: Path, **backend: float) -> AsyncIterator[
        tuple[ScriptedServer, RespBackend]]:
    """A scripted server on a unix socket and a client of it (closed after the block)."""
    path = str(tmp_path / "resp.sock")
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen()
    server = ScriptedServer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, trio.SocketListener(sock))
        client = RespBackend(f"unix://{path}", **backend)  # type: ignore[arg-type]
        try:
            yield server, client
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()


async def test_a_pooled_pipeline_fails_at_exactly_the_timeout(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    async with served(tmp_path, pool_size=4, command_timeout_s=2.0) as (server, backend):
        assert await backend.execute([("PING",)]) == [b"OK"]  # a pooled connection
        await trio.sleep(7.3)  # idle through several of the watchdog's looks: no harm
        assert await backend.execute([("PING",)]) == [b"OK"]
        server.silent = True
        started = trio.current_time()
        with trio.fail_after(10), pytest.raises(BackendUnavailable, match=r"within 2\.0 s"):
            await backend.execute([("GET", "a"), ("GET", "b")])
        assert trio.current_time() - started == pytest.approx(2.0)
        stats = backend.statistics()
        assert (stats.failures, stats.connections_open, stats.stale_retries) == (1, 0, 0)
        server.silent = False  # a new connection serves the next pipeline
        assert await backend.execute([("PING",)]) == [b"OK"]
        assert server.connections == 2


async def test_a_pipeline_waiting_for_a_slot_is_bounded_from_its_start(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    async with served(tmp_path, pool_size=1, command_timeout_s=2.0) as (server, backend):
        assert await backend.execute([("PING",)]) == [b"OK"]
        server.silent = True
        started = trio.current_time()
        ended: list[float] = []

        async def one() -> None:
            with pytest.raises(BackendUnavailable, match="no reply within"):
                await backend.execute([("GET", "a")])
            ended.append(trio.current_time() - started)

        async with trio.open_nursery() as inner:
            inner.start_soon(one)  # the pooled connection, under the watchdog
            inner.start_soon(one)  # waits for the slot, then connects: under a scope
        assert ended == [pytest.approx(2.0), pytest.approx(2.0)]
        assert backend.statistics().connections_open == 0


async def test_a_slow_reply_within_the_bound_keeps_its_connection(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    async with served(tmp_path, pool_size=2, command_timeout_s=2.0) as (server, backend):
        assert await backend.execute([("PING",)]) == [b"OK"]
        server.delay_s = 1.9
        for _ in range(5):  # each began after the last: each has its own 2 s
            assert await backend.execute([("PING",)]) == [b"OK"]
        stats = backend.statistics()
        assert (stats.failures, stats.connections_open, server.connections) == (0, 1, 1)


async def test_an_idle_connection_looks_closed_on_eof_or_unasked_bytes() -> None:
    # The pre-use check (one poll of the socket alone, on a poll set made once).
    for goodbye in (b"", b"-ERR bye\r\n"):
        sock, peer = trio.socket.socketpair()
        conn = _Connection(trio.SocketStream(sock), 1.0)
        assert conn.poll is not None and not conn.looks_closed()
        if goodbye:
            await peer.send(goodbye)
        else:
            peer.close()
        assert conn.looks_closed()
        conn.close_nowait()
        peer.close()


async def test_a_zero_bound_fails_every_pipeline_at_once(tmp_path: Path) -> None:
    async with served(tmp_path, command_timeout_s=0) as (_, backend):
        for _ in range(2):
            with trio.fail_after(5), pytest.raises(BackendUnavailable, match="no reply"):
                await backend.execute([("PING",)])


def test_a_pool_reused_in_another_trio_run_is_still_bounded(tmp_path: Path) -> None:
    # The first run's watchdog is gone with its run: the second run's pipelines on those
    # pooled connections must not go unbounded (they take the deadline scope).
    path = str(tmp_path / "resp.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    silent = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        reader = hiredis.Reader()
        with conn:
            while data := conn.recv(65536):
                reader.feed(data)
                count = 0
                while reader.gets() is not False:
                    count += 1
                if not silent.is_set():
                    conn.sendall(b"+OK\r\n" * count)

    threading.Thread(target=serve, daemon=True).start()
    backend = RespBackend(f"unix://{path}", command_timeout_s=0.5)

    async def first() -> None:
        assert await backend.execute([("PING",)]) == [b"OK"]

    async def second() -> None:
        assert backend.statistics().connections_idle == 1
        with trio.fail_after(5), pytest.raises(BackendUnavailable, match=r"within 0\.5 s"):
            await backend.execute([("PING",)])

    trio.run(first)
    silent.set()
    trio.run(second)
    listener.close()


async def test_a_pipeline_the_server_does_not_read_fails_at_the_timeout(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    # Larger than the socket buffers: the write itself waits, under the watchdog too.
    async with served(tmp_path, pool_size=1, command_timeout_s=2.0) as (server, backend):
        assert await backend.execute([("PING",)]) == [b"OK"]
        server.reading = False
        started = trio.current_time()
        with trio.fail_after(10), pytest.raises(BackendUnavailable, match=r"within 2\.0 s"):
            await backend.execute([("SET", "big", b"x" * 50_000_000)])
        assert trio.current_time() - started == pytest.approx(2.0)
        assert backend.statistics().connections_open == 0
        server.reading = True
        assert await backend.execute([("PING",)]) == [b"OK"]


async def test_a_subscription_whose_subscribe_write_fails_closes_its_socket(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    # The server reads nothing: a SUBSCRIBE larger than the socket buffers cannot be
    # written within the bound. The connection must be closed there, not left open and
    # kept alive by the watchdog's reference to it.
    opened: list[_Connection] = []
    async with served(tmp_path, pool_size=1, command_timeout_s=2.0) as (server, backend):
        connect = backend._connect

        async def remembered() -> _Connection:
            conn = await connect()
            opened.append(conn)
            return conn

        backend._connect = remembered  # type: ignore[method-assign]
        server.reading = False
        with trio.fail_after(10), pytest.raises(BackendUnavailable, match="subscribe"):
            async with backend.open_subscription("c" * 50_000_000):
                pytest.fail("subscribed although the write failed")
        (conn,) = opened
        assert conn.closed
        assert conn.stream.socket.fileno() == -1  # type: ignore[attr-defined]
        assert backend.statistics().connections_open == 0
