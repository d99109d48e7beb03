"""``ServerConfig.max_connections`` on a real socket: at the bound an idle kept-alive
connection makes room for a newcomer; with none idle the newcomer waits in the listen
queue, unanswered and unrefused, until a connection closes or goes idle."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests.integration.test_http_server import read_answer as answer
from triogate.server import ServerConfig, serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.integration

REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
HOLD = b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\n"


class Held:
    """An app whose ``/hold`` requests wait until :attr:`release` is set."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.holding = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/hold":
            self.holding += 1
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def capped(nursery: trio.Nursery) -> AsyncIterator[tuple[int, Held]]:
    app = Held()
    shutdown = trio.Event()
    config = ServerConfig(max_connections=2, keep_alive_s=60, shutdown_grace_s=1)
    (url,) = await nursery.start(partial(serve, app, config, shutdown=shutdown))
    yield int(url.rsplit(":", 1)[1]), app
    app.release.set()
    shutdown.set()


async def test_an_idle_kept_alive_connection_makes_room_for_a_newcomer(
    capped: tuple[int, Held],
) -> None:
    port, app = capped
    with trio.fail_after(10):
        idle = await trio.open_tcp_stream("127.0.0.1", port)
        await idle.send_all(REQUEST)
        assert (await answer(idle)).startswith(b"HTTP/1.1 200")
        busy = await trio.open_tcp_stream("127.0.0.1", port)
        await busy.send_all(HOLD)
        while app.holding < 1:
            await trio.sleep(0.01)
        newcomer = await trio.open_tcp_stream("127.0.0.1", port)
        await newcomer.send_all(REQUEST)
        assert (await answer(newcomer)).startswith(b"HTTP/1.1 200")
        assert await idle.receive_some(65536) == b""  # closed to make room
        app.release.set()
        assert (await answer(busy)).startswith(b"HTTP/1.1 200")  # the busy one is untouched


async def test_with_none_idle_a_newcomer_waits_until_one_is(capped: tuple[int, Held]) -> None:
    port, app = capped
    with trio.fail_after(10):
        busy = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        for stream in busy:
            await stream.send_all(HOLD)
        while app.holding < 2:
            await trio.sleep(0.01)
        newcomer = await trio.open_tcp_stream("127.0.0.1", port)  # the kernel's queue
        await newcomer.send_all(REQUEST)
        with trio.move_on_after(0.5) as waited:
            await newcomer.receive_some(65536)
        assert waited.cancelled_caught  # not answered, not refused: waiting
        app.release.set()  # both answer and go idle: one makes room
        for stream in busy:
            assert (await answer(stream)).startswith(b"HTTP/1.1 200")
        assert (await answer(newcomer)).startswith(b"HTTP/1.1 200")


async def test_a_connection_that_sent_nothing_yet_is_not_taken_for_idle(
    capped: tuple[int, Held],
) -> None:
    port, _ = capped
    with trio.fail_after(10):
        silent = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        await trio.sleep(0.2)  # both accepted, neither has asked anything
        newcomer = await trio.open_tcp_stream("127.0.0.1", port)
        await newcomer.send_all(REQUEST)
        with trio.move_on_after(0.5) as waited:
            await newcomer.receive_some(65536)
        assert waited.cancelled_caught
        for stream in silent:  # still open: they may ask now
            await stream.send_all(REQUEST)
            assert (await answer(stream)).startswith(b"HTTP/1.1 200")
