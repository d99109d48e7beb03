"""Upstreams that keep a request going: a stream that trickles past its stream timeout,
a stream that sends more output than the request allows, an upstream that never answers
a client who already left. Raw sockets on loopback; the gateway in the test's process."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import httpx
import openai
import orjson
import pytest
import trio

from tests.e2e.conftest import (
    MASTER_HEADERS,
    MASTER_KEY,
    gateway_config,
    running_gateway,
    spend_rows,
)
from tests.e2e.hostile_upstream import (
    STREAM_HEAD,
    Hostile,
    chat_chunk,
    chunked,
    measured,
    open_hostile,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

STREAM_TIMEOUT_S = 1.5
#: Output tokens the gateway assumes without max_tokens (the reservation's default).
DEFAULT_OUTPUT = 50


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    async with open_hostile() as upstream:
        yield upstream


@pytest.fixture
async def gateway(tmp_path: Path, redis: RespBackend, redis_url: str,
                  hostile: Hostile) -> AsyncIterator[Gateway]:
    config = gateway_config(
        tmp_path / "state", redis_url, hostile.url,
        router_settings={"num_retries": 0, "allowed_fails": 1000},
        triogate={"governance": {"default_max_output_tokens": DEFAULT_OUTPUT,
                                 "default_max_stream_output_tokens": DEFAULT_OUTPUT}})
    config = attrs.evolve(config, deployments=tuple(
        attrs.evolve(d, stream_timeout_s=STREAM_TIMEOUT_S) for d in config.deployments))
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


def client(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY,
                              max_retries=0, timeout=60)


async def stream_until_timeout(gateway: Gateway) -> None:
    """A chat stream through the openai SDK that must end with the timeout error."""
    response = await client(gateway).chat.completions.create(
        model="gpt-test", max_tokens=10_000, stream=True,
        messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.APIError, match="did not answer in time"):
        async for _ in response:
            pass


async def test_a_trickling_stream_ends_at_its_stream_timeout(
    gateway: Gateway, hostile: Hostile
) -> None:
    """An event every 0.2 s for ever (each wait well under the timeout): the stream ends
    with a timeout error event once ``stream_timeout`` has passed since the call began,
    the upstream is dropped and the request settled as an error."""

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(STREAM_HEAD)
        while True:
            await stream.send_all(chunked(chat_chunk("a")))
            await trio.sleep(0.2)

    hostile.script = answer
    started = trio.current_time()
    with trio.fail_after(20):
        await stream_until_timeout(gateway)
        took = trio.current_time() - started
        rows = await spend_rows(gateway, 1)
        await hostile.wait_dropped()
    assert STREAM_TIMEOUT_S - 0.1 < took < STREAM_TIMEOUT_S + 1.5, took
    assert rows[0].status == "error"


async def test_a_silent_stream_ends_at_its_stream_timeout_not_later(
    gateway: Gateway, hostile: Hostile
) -> None:
    """Events for 1 s, then silence: the stream still ends at ``stream_timeout`` after
    the call began (a whole timeout of silence would have taken until 2.5 s)."""

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(STREAM_HEAD)
        for _ in range(5):
            await stream.send_all(chunked(chat_chunk("a")))
            await trio.sleep(0.2)
        await trio.sleep_forever()

    hostile.script = answer
    started = trio.current_time()
    with trio.fail_after(20):
        await stream_until_timeout(gateway)
    took = trio.current_time() - started
    assert STREAM_TIMEOUT_S - 0.1 < took < STREAM_TIMEOUT_S + 0.6, took


@pytest.mark.parametrize("max_tokens", [20, None])
async def test_a_runaway_stream_stops_at_the_requests_output_bound(
    gateway: Gateway, hostile: Hostile, max_tokens: int | None
) -> None:
    """An upstream that ignores max_tokens and streams for ever: the gateway stops the
    stream once the output passes the request's bound (``max_tokens``, else the
    reservation's default), tells the client, drops the upstream, and bills no more
    output than the bound."""
    word = "word " * 4  # about five tokens per event

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(STREAM_HEAD)
        for _ in range(100_000):
            await stream.send_all(chunked(chat_chunk(word)))
            await trio.sleep(0.001)

    hostile.script = answer
    bound = max_tokens or DEFAULT_OUTPUT
    body: dict[str, object] = {"model": "gpt-test", "stream": True,
                               "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    with trio.fail_after(30):
        async with httpx.AsyncClient(timeout=30) as http, http.stream(
            "POST", f"{gateway.openai_base}/chat/completions", json=body,
            headers=MASTER_HEADERS,
        ) as response:
            assert response.status_code == 200
            seen = b"".join([part async for part in response.aiter_raw()])
        rows = await spend_rows(gateway, 1)
        await hostile.wait_dropped()
    events = [e for e in seen.split(b"\n\n") if e.startswith(b"data: {")]
    last = orjson.loads(events[-1][len(b"data: "):])
    assert last["error"]["code"] == "upstream_output_bound", last
    text = "".join(orjson.loads(e[len(b"data: "):])["choices"][0]["delta"]["content"]
                   for e in events[:-1])
    # Stopped once past the bound and its margin for the count (the count is read every
    # 8th write: eight events of five tokens more at most).
    assert len(text) // 4 <= bound + bound // 4 + 16 + 8 * 5, len(text)
    assert rows[0].status == "error"
    assert rows[0].output_tokens <= bound, rows[0]


async def test_a_client_that_leaves_cancels_its_upstream_call(
    gateway: Gateway, hostile: Hostile
) -> None:
    """A non-streamed request whose upstream never answers: the client gives up after
    0.5 s; the gateway drops the upstream connection at once and settles the request as
    cancelled (its parallel slot and reservation given back)."""
    answered = trio.Event()

    async def answer(stream: trio.abc.Stream) -> None:
        answered.set()  # and no answer: the connection waits (for another request)

    hostile.script = answer
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=0.5) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(f"{gateway.openai_base}/chat/completions", headers=MASTER_HEADERS,
                                json={"model": "gpt-test", "max_tokens": 5,
                                      "messages": [{"role": "user", "content": "hi"}]})
        left = trio.current_time()
        await hostile.wait_dropped()
        assert trio.current_time() - left < 2
        rows = await spend_rows(gateway, 1)
    assert rows[0].status == "cancelled", rows[0]
    assert answered.is_set()


async def test_streams_through_a_trickling_upstream_keep_memory_flat(
    gateway: Gateway, hostile: Hostile
) -> None:
    """Twenty trickling streams at once, each ended at its timeout: memory stays flat."""

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(STREAM_HEAD)
        while True:
            await stream.send_all(chunked(chat_chunk("a" * 1000)))
            await trio.sleep(0.05)

    hostile.script = answer

    async def one() -> None:
        response = await client(gateway).chat.completions.create(
            model="gpt-test", max_tokens=100_000, stream=True,
            messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.APIError):
            async for _ in response:
                pass

    with trio.fail_after(30):
        async with measured() as usage, trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(one)
    assert usage.growth < 64 * 1024 * 1024, usage


async def test_failed_streams_leave_no_memory_behind(gateway: Gateway, hostile: Hostile) -> None:
    """Ninety streams, six at a time, each failed by a line past the event bound (4 MiB
    by default): the bytes held go with each failure. (An error kept in a reference
    cycle with its stream kept 4 MiB per failed stream until a full collection: some
    hundreds of MiB here.)"""
    piece = chunked(b"x" * 65536)

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(STREAM_HEAD)
        for _ in range(16 * 1024 * 1024 // 65536):
            await stream.send_all(piece)

    hostile.script = answer

    async def streams() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(15):
                reply = await http.post(
                    f"{gateway.openai_base}/chat/completions", headers=MASTER_HEADERS,
                    json={"model": "gpt-test", "max_tokens": 5, "stream": True,
                          "messages": [{"role": "user", "content": "hi"}]})
                assert reply.status_code == 502

    with trio.fail_after(60):
        async with measured() as usage, trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(streams)
    assert usage.growth < 100 * 1024 * 1024, usage
