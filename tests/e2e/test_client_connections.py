"""Client connections: closed as soon as the client closes its side (no CLOSE-WAIT until the
75 s keep-alive ends), a request that stops arriving is answered 408 and closed, and a
client that is only waiting for its answer (a long call, a long stream) is never cut."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

BODY = orjson.dumps({"model": "gpt-test", "max_tokens": 5,
                     "messages": [{"role": "user", "content": "hello"}]})


def request_head(length: int) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
            b"authorization: Bearer " + MASTER_KEY.encode() + b"\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % length)


async def connect(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").split(":")
    return await trio.open_tcp_stream(host, int(port))


async def read_response(stream: trio.SocketStream) -> bytes:
    """One response with a content-length (the gateway's non-streamed answers)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    return head + b"\r\n\r\n" + rest


async def read_to_eof(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


def one_shot_clients(url: str, n: int) -> list[bytes]:
    host, port = url.removeprefix("http://").split(":")
    answers = []
    for _ in range(n):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request_head(len(BODY)) + BODY)
            answers.append(sock.recv(65536))
    return answers


def server_connections(port: int) -> int:
    """TCP connections whose local end is the gateway's port, still open on its side
    (ESTABLISHED or CLOSE-WAIT), from the kernel's tables. Counting the process's file
    descriptors instead would also count the Redis pool's and SQLite's, which grow on their
    own under load."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if int(local.rsplit(":", 1)[1], 16) == port and state in ("01", "08"):
                    count += 1
    return count


def config(tmp_path: Path, redis_url: str, upstream: FakeUpstream, **http: Any) -> Any:
    return gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                          triogate={"http": http})


async def test_the_gateway_closes_a_connection_as_soon_as_the_client_does(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    with trio.fail_after(60):
        async with running_gateway(config(tmp_path, redis_url, upstream,
                                          cancel_when_client_leaves=False)) as gw:
            # The client closes its side while its answer is on the way: the gateway answers,
            # then closes its side at once instead of keeping the socket for the 75 s
            # keep-alive (the race seen from outside: the close read before the
            # connection was recycled for the next request).
            stream = await connect(gw.url)
            await stream.send_all(request_head(len(BODY)) + BODY)
            await stream.send_eof()
            with trio.fail_after(2):
                assert (await read_to_eof(stream)).startswith(b"HTTP/1.1 200")
            await stream.aclose()

            # 100 one-shot clients in a thread of their own (blocking sockets, as another
            # process would: their close often arrives before the connection is recycled).
            # The gateway closes its side at once; none is left in CLOSE-WAIT (before the
            # fix they stayed for the 75 s keep-alive).
            port = int(gw.url.rsplit(":", 1)[1])
            answers = await trio.to_thread.run_sync(one_shot_clients, gw.url, 100)
            assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
            with trio.fail_after(3):
                while server_connections(port) > 0:
                    await trio.sleep(0.05)


async def test_a_request_that_stops_arriving_is_answered_408_and_closed(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    with trio.fail_after(60):
        async with running_gateway(config(tmp_path, redis_url, upstream,
                                          body_read_timeout_s=0.5)) as gw:
            for partial in (request_head(len(BODY)) + BODY[:10],    # stops mid-body
                            request_head(len(BODY))[:30]):         # stops mid-head
                stream = await connect(gw.url)
                await stream.send_all(partial)
                with trio.fail_after(3):
                    answer = await read_to_eof(stream)
                head, _, body = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 408"), answer
                error = orjson.loads(body)["error"]
                assert error["type"] == "invalid_request_error"
                assert "timed out" in error["message"]
                await stream.aclose()
            assert upstream.requests == []  # neither reached the model


async def test_a_client_waiting_for_its_answer_is_not_timed_out(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    upstream.latency_s = 1.5  # three body timeouts with nothing from the client
    with trio.fail_after(60):
        async with running_gateway(config(tmp_path, redis_url, upstream,
                                          body_read_timeout_s=0.5)) as gw:
            stream = await connect(gw.url)
            await stream.send_all(request_head(len(BODY)) + BODY)
            answer = await read_response(stream)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["choices"]
            await stream.aclose()

            upstream.latency_s, upstream.chunk_delay_s = 0.0, 0.3  # a stream of > 1.5 s
            async with httpx.AsyncClient(timeout=30) as http, http.stream(
                    "POST", f"{gw.url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {MASTER_KEY}"},
                    json={**orjson.loads(BODY), "stream": True}) as streamed:
                lines = [line async for line in streamed.aiter_lines() if line]
            assert streamed.status_code == 200
            assert lines[-1] == "data: [DONE]" and len(lines) > 5
