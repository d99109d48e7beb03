"""Overload is refused, not queued: beyond ``triogate.max_in_flight`` requests in flight, a
request is answered 503 with ``Retry-After`` at once, in its API's error shape."""

from __future__ import annotations

import os
import socket
import struct
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.e2e.conftest import MASTER_HEADERS, gateway_config, running_gateway, short_request
from triogate.app import LISTEN_BACKLOG, serve

if TYPE_CHECKING:
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

LIMIT = 3
HEADERS = MASTER_HEADERS
CHAT = short_request("chat", "hold on")
MESSAGES = short_request("messages", "hold on")


async def test_requests_beyond_the_limit_are_refused_at_once(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    upstream.latency_s = 2.0  # the admitted requests hold their places meanwhile
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"max_in_flight": LIMIT})
    held: list[httpx.Response] = []
    with trio.fail_after(60):
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:

            async def hold() -> None:
                held.append(await http.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                                            headers=HEADERS))

            async with trio.open_nursery() as nursery:
                for _ in range(LIMIT):
                    nursery.start_soon(hold)
                while len(upstream.requests) < LIMIT:  # all three reached the upstream
                    await trio.sleep(0.01)
                refused = [await http.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                                           headers=HEADERS) for _ in range(4)]
                refused.append(await http.post(f"{gw.url}/v1/messages", json=MESSAGES,
                                               headers=HEADERS))
                probe = await http.get(f"{gw.url}/health/liveliness")
                upstream_calls_while_full = len(upstream.requests)
            after = await http.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                                    headers=HEADERS)
    assert [r.status_code for r in held] == [200] * LIMIT
    assert [r.status_code for r in refused] == [503] * 5
    assert all(r.headers["retry-after"] == "1" for r in refused)
    assert all(r.headers["connection"] == "close" for r in refused)  # shed, not kept alive
    assert refused[0].json()["error"]["code"] == "overloaded"
    assert refused[0].json()["error"]["type"] == "service_unavailable"
    assert refused[-1].json() == {"type": "error", "error": {
        "type": "overloaded_error", "message": refused[-1].json()["error"]["message"]}}
    assert upstream_calls_while_full == LIMIT  # the refused ones never went upstream
    assert probe.status_code == 200
    assert after.status_code == 200  # places are given back


def _listen_queue_size(sock: socket.socket) -> int:
    """The kernel's accept-queue size of a listening socket (Linux TCP_INFO: for a socket
    in LISTEN, ``tcpi_sacked`` holds the backlog the last ``listen()`` asked for)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    (size,) = struct.unpack_from("I", info, 28)
    return int(size)


@pytest.mark.skipif(sys.platform != "linux", reason="TCP_INFO of a listening socket")
async def test_the_listen_queue_holds_a_burst_of_connections(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    # hypercorn's default backlog (100) dropped the SYNs of a burst (31,602 listen
    # overflows while wrk opened 4,096 connections); dropped clients wait for their
    # retransmission (1 s, 3 s, ...) before the in-flight limit can even refuse them.
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url)
    listener = socket.create_server(("127.0.0.1", 0), backlog=1)
    probe = socket.socket(fileno=os.dup(listener.fileno()))
    shutdown = trio.Event()
    try:
        assert _listen_queue_size(probe) == 1
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(serve, config, listen_fd=listener.detach(),
                                            shutdown=shutdown, handle_signals=False))
                size = _listen_queue_size(probe)
                shutdown.set()
    finally:
        probe.close()
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert size == min(LISTEN_BACKLOG, somaxconn) > 100
