"""The gateway's HTTP server (``triogate.server``) on a real socket: its connection
lifecycle. The keep-alive timer (an idle connection closes after ``keep_alive_s``, a busy
one does not; shutdown closes idle ones at once and busy ones after their answer; a
request outliving the grace period is cancelled), the write path (a response in one
write; a stream one write per send; a head without a body still sent), ``date`` formatted
once a second, and an inherited listening socket (``--workers``).

These behaviours were hypercorn's plus the gateway's patches to it
(``test_hypercorn_patches.py`` before the server replaced hypercorn)."""

from __future__ import annotations

import socket
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from triogate.server import CachedDate, ServerConfig, serve
from triogate.server._connection import Connection

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.integration

KEEP_ALIVE_S = 0.6
REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    if scope["path"] == "/slow":
        await trio.sleep(2 * KEEP_ALIVE_S)
    if scope["path"] == "/forever":
        await trio.sleep_forever()
    if scope["path"] == "/headless":  # a head, then the app ends without a body
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        return
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i,
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[tuple[str, int, trio.Event]]:
    shutdown = trio.Event()
    config = ServerConfig(keep_alive_s=KEEP_ALIVE_S, shutdown_grace_s=10)
    (url,) = await nursery.start(partial(serve, app, config, shutdown=shutdown))
    host, port = url.removeprefix("http://").split(":")
    yield host, int(port), shutdown
    shutdown.set()


async def read_answer(stream: trio.SocketStream) -> bytes:
    """Bytes up to the end of an answer whose body is ``ok``."""
    data = b""
    while not data.endswith(b"ok"):
        chunk = await stream.receive_some(65536)
        assert chunk, data
        data += chunk
    return data


async def _ask(stream: trio.SocketStream, request: bytes = REQUEST) -> bytes:
    await stream.send_all(request)
    return await read_answer(stream)


async def _closed_after(stream: trio.SocketStream) -> float:
    started = trio.current_time()
    assert await stream.receive_some(65536) == b""
    return trio.current_time() - started


async def read_to_eof(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


async def test_an_idle_connection_closes_after_the_keep_alive_and_a_busy_one_stays(
    server: tuple[str, int, trio.Event],
) -> None:
    host, port, _ = server
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream(host, port)
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
        other = await trio.open_tcp_stream(host, port)
        assert KEEP_ALIVE_S * 0.8 < await _closed_after(other) < KEEP_ALIVE_S * 3


async def test_shutdown_closes_an_idle_connection_at_once_and_a_busy_one_after_its_answer(
    server: tuple[str, int, trio.Event],
) -> None:
    host, port, shutdown = server
    with trio.fail_after(20):
        idle = await trio.open_tcp_stream(host, port)
        await _ask(idle)
        busy = await trio.open_tcp_stream(host, port)
        await busy.send_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        await trio.sleep(0.1)
        shutdown.set()
        assert await _closed_after(idle) < KEEP_ALIVE_S / 2
        answer = await read_to_eof(busy)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
        assert b"\r\nconnection: close\r\n" in answer  # the client learns it will not be kept
        with pytest.raises(OSError):  # no longer accepting
            await trio.open_tcp_stream(host, port)


async def test_a_request_outliving_the_grace_period_is_cancelled_and_serve_returns() -> None:
    shutdown = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            (url,) = await nursery.start(partial(
                serve, app, ServerConfig(shutdown_grace_s=0.5), shutdown=shutdown))
            host, port = url.removeprefix("http://").split(":")
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(b"GET /forever HTTP/1.1\r\nhost: x\r\n\r\n")
            await trio.sleep(0.1)
            shutdown.set()
            stopping = trio.current_time()
        # serve returned at the grace period: the request was cancelled, its socket closed.
        assert 0.4 < trio.current_time() - stopping < 2
        assert await read_to_eof(stream) == b""


async def test_a_response_leaves_in_one_write_and_a_headless_one_still_gets_its_head(
    server: tuple[str, int, trio.Event], monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes: list[bytes] = []
    real = Connection._write

    async def counted(self: Connection, data: bytes) -> None:
        writes.append(data)
        await real(self, data)

    monkeypatch.setattr(Connection, "_write", counted)
    host, port, _ = server
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream(host, port)
        for _ in range(3):
            answer = await _ask(stream)
            assert answer.startswith(b"HTTP/1.1 200") and b"\r\ndate: " in answer
            assert writes[-1] == answer  # head and body: one write
        assert len(writes) == 3
        # A stream: the head leaves with the first chunk, then one write per send.
        await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"0\r\n\r\n"):
            answer += await stream.receive_some(65536)
        assert len(writes) == 3 + 4
        assert writes[3].startswith(b"HTTP/1.1 200") and writes[3].endswith(b"data: 0\n\n\r\n")
        assert b"transfer-encoding: chunked\r\n" in writes[3]
        assert writes[4:] == [b"9\r\ndata: 1\n\n\r\n", b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]
        other = await trio.open_tcp_stream(host, port)
        await other.send_all(b"GET /headless HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = await read_to_eof(other)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n")


async def test_an_http_client_reads_answers_and_streams(
    server: tuple[str, int, trio.Event],
) -> None:
    host, port, _ = server
    with trio.fail_after(20):
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
            for _ in range(3):
                answer = await http.get("/")
                assert answer.status_code == 200 and answer.text == "ok"
            async with http.stream("GET", "/stream") as streamed:
                assert [line async for line in streamed.aiter_lines() if line] == [
                    "data: 0", "data: 1", "data: 2"]


async def test_an_inherited_listening_socket_is_served() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # bound, not yet listening: serve listens on it
    port = listener.getsockname()[1]
    shutdown = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            (url,) = await nursery.start(partial(
                serve, app, ServerConfig(), shutdown=shutdown, sock=listener))
            assert url == f"http://127.0.0.1:{port}"
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            assert (await _ask(stream)).startswith(b"HTTP/1.1 200")
            shutdown.set()
    assert listener.fileno() == -1


def test_the_date_header_is_formatted_once_a_second() -> None:
    date = CachedDate()
    first = date()
    assert first.startswith(b"date: ") and first.endswith(b" GMT\r\n") and date() is first
