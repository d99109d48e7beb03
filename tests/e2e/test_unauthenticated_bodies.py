"""Requests judged on their head before their body is read, behind both servers: no key is
401 at once (no ``100 Continue``, no body waited for); bodies trickled with a key only
Redis could check do not hold ``max_in_flight`` slots: they are read a smaller bound's
worth at a time (the others wait their turn), each within ``max_body_read_s``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import (
    BOTH_SERVERS,
    MASTER_HEADERS,
    gateway_config,
    running_gateway,
    short_request,
)

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e, BOTH_SERVERS]

BODY = orjson.dumps(short_request("chat", "trickled"))


async def open_request(url: str, head: bytes) -> trio.SocketStream:
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(head)
    return stream


async def read_answer(stream: trio.SocketStream) -> bytes:
    """One answer: its head and its ``content-length`` of body (or all until the close)."""
    data = b""
    while True:
        head, found, body = data.partition(b"\r\n\r\n")
        if found:
            for line in head.lower().split(b"\r\n"):
                if line.startswith(b"content-length:") and len(body) >= int(line[15:]):
                    return data
        chunk = await stream.receive_some(65536)
        if not chunk:
            return data
        data += chunk


def chat_head(key: bytes | None, *, extra: bytes = b"", path: bytes = b"/v1/chat/completions"
              ) -> bytes:
    auth = b"authorization: Bearer " + key + b"\r\n" if key else b""
    return (b"POST " + path + b" HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            + auth + extra + b"content-length: %d\r\n\r\n" % len(BODY))


async def test_no_key_is_401_on_the_head_without_reading_the_body(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream, server: str,
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url)
    with trio.fail_after(60):
        async with running_gateway(config, server=server) as gateway:
            cases = [(b"", b"/v1/chat/completions", b"authentication_error")]
            if server == "triogate":
                # Expect: 100-continue: refused before the client is told to send. (hypercorn
                # sends its 100 as soon as the head is in, whatever the application says.)
                cases.append((b"expect: 100-continue\r\n", b"/v1/messages",
                              b"authentication_error"))
            for extra, path, kind in cases:
                stream = await open_request(gateway.url, chat_head(None, extra=extra,
                                                                   path=path))
                async with stream:
                    with trio.fail_after(5):  # the body never comes: answered anyway
                        answer = await read_answer(stream)
                assert answer.startswith(b"HTTP/1.1 401 "), answer[:300]
                assert b"100 Continue" not in answer
                assert b"x-request-id" in answer.lower()
                assert kind in answer or b"missing API key" in answer
            # A key known to be invalid (memory remembers "no such key") is refused too.
            async with httpx.AsyncClient(timeout=10) as http:
                first = await http.post(f"{gateway.openai_base}/chat/completions",
                                        headers={"authorization": "Bearer sk-nobody"},
                                        json=short_request("chat", "x"))
                assert first.status_code == 401
            stream = await open_request(gateway.url, chat_head(b"sk-nobody"))
            async with stream:
                with trio.fail_after(5):
                    answer = await read_answer(stream)
            assert answer.startswith(b"HTTP/1.1 401 "), answer[:300]


BODY_READ_S = 8


async def requests_left(gateway: Gateway, count: int) -> None:
    """Until at most ``count`` requests are inside the application. Behind hypercorn a
    client has its answer before its handler returns (and leaves ``max_in_flight``)."""
    if gateway.requests is not None:
        with trio.fail_after(5):
            while gateway.requests.count > count:
                await trio.sleep(0.01)


async def test_trickled_bodies_hold_no_in_flight_slot_and_have_their_own_bound(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream, server: str,
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url, triogate={
        "max_in_flight": 2,
        # Wait and read together: long enough for the third body's turn on a busy host.
        "http": {"max_unauthenticated_bodies": 2, "max_body_read_s": BODY_READ_S}})
    with trio.fail_after(60):
        async with running_gateway(config, server=server) as gateway, \
                httpx.AsyncClient(timeout=20) as http:
            # Two clients trickle bodies with keys no one has seen (only Redis could say):
            # they hold the two turns to read such bodies.
            tricklers = [await open_request(gateway.url, chat_head(b"sk-unseen-%d" % n))
                         for n in range(2)]
            for stream in tricklers:
                await stream.send_all(BODY[:1])
            await trio.sleep(0.3)
            # A third, whole body at once, waits for its turn.
            third = await open_request(gateway.url, chat_head(b"sk-unseen-3") + BODY)
            with trio.move_on_after(0.3):
                assert await third.receive_some(65536) == b"", "answered before its turn"
            # The in-flight slots are all free for requests with a good key meanwhile.
            for n in range(3):
                ok = await http.post(f"{gateway.openai_base}/chat/completions",
                                     headers=MASTER_HEADERS,
                                     json=short_request("chat", f"normal {n}"))
                assert ok.status_code == 200, ok.text
            await requests_left(gateway, len(tricklers) + 1)
            # The trickled bodies, once complete, meet the key check as ever (401); then
            # the third has its turn.
            held = [*tricklers, third]
            for left, stream in enumerate(held, start=1):
                async with stream:
                    if stream is not third:
                        await stream.send_all(BODY[1:])
                    with trio.fail_after(10):
                        answer = await read_answer(stream)
                    assert answer.startswith(b"HTTP/1.1 401 "), answer[:300]
                await requests_left(gateway, len(held) - left)
            # Bodies that never come are 408 at the bound, and free their turns.
            holders = [await open_request(gateway.url, chat_head(b"sk-unseen-%d" % n))
                       for n in (4, 5)]
            started = trio.current_time()
            for stream in holders:
                await stream.send_all(BODY[:1])
            for stream in holders:
                async with stream:
                    with trio.fail_after(BODY_READ_S + 15):
                        answer = await read_answer(stream)
                    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
            assert BODY_READ_S - 0.5 < trio.current_time() - started < BODY_READ_S + 10
            async with httpx.AsyncClient(timeout=20) as fresh:
                after = await fresh.post(f"{gateway.openai_base}/chat/completions",
                                         headers={"authorization": "Bearer sk-unseen-9"},
                                         json=short_request("chat", "after"))
            assert after.status_code == 401
