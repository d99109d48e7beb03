"""hypercorn as the gateway patches it, on a real server: the keep-alive timer that
replaces hypercorn's (``connections.IdleTimer``: an idle connection closes after
``keep_alive_timeout``, a busy one does not, shutdown closes idle ones at once) and the
write path of ``h11_writes`` (a response in one write; a head without a body still sent)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
import trio
from hypercorn.events import RawData
from hypercorn.trio.run import worker_serve
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.utils import wrap_app

from triogate.api import connections, h11_writes

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.integration

KEEP_ALIVE_S = 0.6
REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].removeprefix("lifespan.")
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    if scope["path"] == "/slow":
        await trio.sleep(2 * KEEP_ALIVE_S)
    if scope["path"] == "/headless":  # a head, then the app ends without a body
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[tuple[str, trio.Event]]:
    connections.install()
    h11_writes.install()
    config = connections.GatewayHttpConfig()
    config.bind = ["127.0.0.1:0"]
    config.keep_alive_timeout = KEEP_ALIVE_S
    config.graceful_timeout = 10
    config.accesslog = None
    shutdown = trio.Event()
    binds = await nursery.start(partial(
        worker_serve, wrap_app(_app, config.wsgi_max_body_size, "asgi"), config,
        shutdown_trigger=shutdown.wait))
    yield binds[0].removeprefix("http://"), shutdown
    shutdown.set()


async def _ask(stream: trio.SocketStream, request: bytes = REQUEST) -> bytes:
    await stream.send_all(request)
    data = b""
    while not data.endswith(b"ok"):
        chunk = await stream.receive_some(65536)
        assert chunk, data
        data += chunk
    return data


async def _closed_after(stream: trio.SocketStream) -> float:
    started = trio.current_time()
    assert await stream.receive_some(65536) == b""
    return trio.current_time() - started


async def test_an_idle_connection_closes_after_the_keep_alive_and_a_busy_one_stays(
    server: tuple[str, trio.Event],
) -> None:
    host, port = server[0].split(":")
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream(host, int(port))
        # Requests closer together than the keep-alive, for longer than it: still open.
        for _ in range(4):
            assert (await _ask(stream)).startswith(b"HTTP/1.1 200")
            await trio.sleep(KEEP_ALIVE_S / 2)
        # A request in flight longer than the keep-alive is not cut.
        assert (await _ask(stream, b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")).startswith(
            b"HTTP/1.1 200")
        # Then idle: closed by the server after about the keep-alive.
        waited = await _closed_after(stream)
        assert KEEP_ALIVE_S * 0.8 < waited < KEEP_ALIVE_S * 3
        # A connection that never sent anything gets the same timer.
        other = await trio.open_tcp_stream(host, int(port))
        assert KEEP_ALIVE_S * 0.8 < await _closed_after(other) < KEEP_ALIVE_S * 3


async def test_shutdown_closes_an_idle_connection_at_once_and_a_busy_one_after_its_answer(
    server: tuple[str, trio.Event],
) -> None:
    host, port = server[0].split(":")
    with trio.fail_after(20):
        idle = await trio.open_tcp_stream(host, int(port))
        await _ask(idle)
        busy = await trio.open_tcp_stream(host, int(port))
        await busy.send_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        await trio.sleep(0.1)
        server[1].set()
        assert await _closed_after(idle) < KEEP_ALIVE_S / 2
        answer = b""
        while chunk := await busy.receive_some(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")


async def test_a_response_leaves_in_one_write_and_a_headless_one_still_gets_its_head(
    server: tuple[str, trio.Event], monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes: list[bytes] = []
    real = TCPServer.protocol_send

    async def counted(self: Any, event: Any) -> None:
        if isinstance(event, RawData):
            writes.append(event.data)
        await real(self, event)

    monkeypatch.setattr(TCPServer, "protocol_send", counted)
    host, port = server[0].split(":")
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream(host, int(port))
        for _ in range(3):
            answer = await _ask(stream)
            assert answer.startswith(b"HTTP/1.1 200") and b"\r\ndate: " in answer
            assert writes[-1] == answer  # head and body: one write
        assert len(writes) == 3
        other = await trio.open_tcp_stream(host, int(port))
        await other.send_all(b"GET /headless HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = b""
        while chunk := await other.receive_some(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n")


def test_the_date_header_is_formatted_once_a_second() -> None:
    date = h11_writes.CachedDate()
    first = date()
    assert first.endswith(b" GMT") and date() is first
