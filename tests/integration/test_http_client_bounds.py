"""The own HTTP server against clients that send without end: chunk extensions out of all
proportion (400), a body trickled past its total time (408), and a body sent as fast as
loopback allows, which must not starve the other connections."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
import trio

from triogate.api.protocol_errors import error_body
from triogate.server import ServerConfig, serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.integration


class Drain:
    """Reads every body to its end and drops it; records how each request ended."""

    def __init__(self) -> None:
        self.ends: list[str] = []
        self.body_bytes = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.ends.append("disconnect")
                return
            self.body_bytes += len(message["body"])
            if not message["more_body"]:
                break
        self.ends.append("complete")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def drain(nursery: trio.Nursery) -> AsyncIterator[tuple[Drain, int]]:
    shutdown = trio.Event()
    app = Drain()
    config = ServerConfig(body_read_timeout_s=0.5, body_total_timeout_s=1.5,
                          write_timeout_s=2.0, error_body=error_body)
    (url,) = await nursery.start(partial(serve, app, config, shutdown=shutdown))
    yield app, int(url.rsplit(":", 1)[1])
    shutdown.set()


def flood(port: int, head: bytes, piece: bytes, seconds: float) -> tuple[int, bytes]:
    """From a thread, as another process would: ``head``, then ``piece`` again and again
    for ``seconds`` or until the server stops reading; (bytes sent, what came back)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        sock.sendall(head)
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                sock.sendall(piece)
                sent += len(piece)
        except OSError:
            pass  # the server answered and closed: what we still send is refused
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
    return sent, answer


async def test_a_chunk_extension_without_end_is_400(drain: tuple[Drain, int]) -> None:
    app, port = drain
    head = (b"POST /upload HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
            b"1;name=")
    with trio.fail_after(20):
        sent, answer = await trio.to_thread.run_sync(flood, port, head, b"a" * 65536, 4.0)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"chunk framing" in answer
    assert app.ends == ["disconnect"]
    # Refused long before the flood ended: the server stopped reading at its bound.
    assert sent < 64 * 1024 * 1024


async def test_a_body_trickled_past_its_total_time_is_408(drain: tuple[Drain, int]) -> None:
    app, port = drain
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"POST /upload HTTP/1.1\r\nhost: t\r\n"
                                  b"content-length: 1000\r\n\r\n")
            started = trio.current_time()
            answer = b""
            with trio.move_on_after(10):
                while not answer:
                    try:
                        await stream.send_all(b"x")  # a byte at a time, never idle 0.5 s
                    except trio.BrokenResourceError:
                        break
                    with trio.move_on_after(0.2):
                        answer = await stream.receive_some(65536)
            took = trio.current_time() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert 1.0 < took < 5.0  # the total bound (1.5 s), not the idle one, ended it
    assert app.ends == ["disconnect"]


#: Another process that sends a body of 100 GB as fast as it can, for ``argv[2]`` seconds.
FLOOD = """
import socket, sys, time
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
sock.sendall(b"POST /upload HTTP/1.1\\r\\nhost: t\\r\\ncontent-length: 100000000000\\r\\n\\r\\n")
piece = b"a" * (1 << 20)
end = time.monotonic() + float(sys.argv[2])
print("flooding", flush=True)
while time.monotonic() < end:
    sock.sendall(piece)
"""


async def test_a_body_sent_as_fast_as_possible_does_not_starve_others(
    drain: tuple[Drain, int],
) -> None:
    app, port = drain
    latencies: list[float] = []
    gaps: list[float] = []

    async def tick() -> None:  # how long the loop goes without running anything else
        last = trio.current_time()
        while True:
            await trio.sleep(0.005)
            now = trio.current_time()
            gaps.append(now - last)
            last = now

    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", FLOOD, str(port), "5"], stdout=subprocess.PIPE)
    try:
        with trio.fail_after(30):
            assert process.stdout is not None
            assert b"flooding" in await process.stdout.receive_some(64)
            await trio.sleep(0.5)  # the flood is under way
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tick)
                await trio.sleep(2)
                nursery.cancel_scope.cancel()
            for _ in range(5):
                started = trio.current_time()
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(
                        b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
                    answer = b""
                    while chunk := await stream.receive_some(65536):
                        answer += chunk
                assert answer.startswith(b"HTTP/1.1 200 ")
                latencies.append(trio.current_time() - started)
                await trio.sleep(0.1)
            flooded = app.body_bytes
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert flooded > 10 * 1024 * 1024  # the flood was arriving meanwhile
    # The loop kept running other tasks between the flood's reads (a tick is 5 ms).
    assert max(gaps) < 0.25, sorted(gaps)[-5:]
    # Each request answered between the flood's reads, not after it (it lasted 5 s).
    assert max(latencies) < 1.0, latencies
