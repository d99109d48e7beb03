"""Upstreams that answer with hostile bytes (raw sockets on loopback): whatever they send,
the worker's memory and CPU stay bounded, the client gets a 502 in its API's shape, the
request is settled as an upstream error and the upstream connection is dropped.

The gateway runs in the test's process: the RSS and CPU measured are the worker's (and
the hostile upstream's, which only writes).
"""

from __future__ import annotations

import gzip
import zlib
from typing import TYPE_CHECKING

import anthropic
import openai
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway, spend_rows
from tests.e2e.hostile_upstream import (
    STREAM_HEAD,
    Hostile,
    chat_chunk,
    chat_completion,
    chunked,
    json_head,
    measured,
    open_hostile,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

MiB = 1024 * 1024
#: The body bound of the gateway under test (small, so that tests stay quick).
BODY_LIMIT = 1 * MiB
EVENT_LIMIT = 256 * 1024


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
        triogate={"http": {"max_upstream_body_bytes": BODY_LIMIT,
                           "max_upstream_event_bytes": EVENT_LIMIT}})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


def openai_client(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY,
                              max_retries=0, timeout=60)


async def chat_502(gateway: Gateway) -> openai.APIStatusError:
    """A chat completion that must fail with 502 in OpenAI's error shape."""
    with pytest.raises(openai.APIStatusError) as caught:
        await openai_client(gateway).chat.completions.create(
            model="gpt-test", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    error = caught.value
    assert error.status_code == 502, error
    assert isinstance(error.body, dict) and error.body.get("type") == "api_error", error.body
    return error


async def settled_as_upstream_error(gateway: Gateway, count: int = 1) -> None:
    rows = await spend_rows(gateway, count)
    assert all(row.status == "error" and row.http_status == 502 for row in rows), rows


# ------------------------------------------------------------------ body size


async def test_an_answer_past_the_body_bound_is_a_502_not_read_on(
    gateway: Gateway, hostile: Hostile
) -> None:
    """A valid answer longer than ``max_upstream_body_bytes``: 502, settled, dropped."""
    body = chat_completion("x" * (3 * BODY_LIMIT))

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(json_head(len(body)))
        await stream.send_all(body)

    hostile.script = answer
    with trio.fail_after(30):
        await chat_502(gateway)
        await settled_as_upstream_error(gateway)
        await hostile.wait_dropped()


async def test_an_endless_chunked_answer_keeps_memory_bounded(
    gateway: Gateway, hostile: Hostile
) -> None:
    """A chunked body that never ends: refused at the bound; RSS grows by a few MiB."""
    piece = chunked(b"x" * 65536)

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(json_head(None))
        for _ in range(256 * MiB // 65536):  # 256 MiB at most (the test's own guard)
            await stream.send_all(piece)

    hostile.script = answer
    with trio.fail_after(30):
        async with measured() as usage:
            await chat_502(gateway)
    assert usage.growth < 64 * MiB, usage
    assert hostile.dropped == 1


@pytest.mark.parametrize("api", ["chat", "messages"])
async def test_an_error_body_past_the_bound_is_a_502(
    gateway: Gateway, hostile: Hostile, api: str
) -> None:
    """An error status whose body never ends (on the streaming path): 502, in the
    client's API's shape."""
    piece = chunked(b"e" * 65536)

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(b"HTTP/1.1 500 Internal Server Error\r\n"
                              b"transfer-encoding: chunked\r\n\r\n")
        for _ in range(64 * MiB // 65536):
            await stream.send_all(piece)

    hostile.script = answer
    with trio.fail_after(30):
        async with measured() as usage:
            if api == "chat":
                with pytest.raises(openai.APIStatusError) as caught:
                    await openai_client(gateway).chat.completions.create(
                        model="gpt-test", max_tokens=5, stream=True,
                        messages=[{"role": "user", "content": "hi"}])
                assert caught.value.status_code == 502
            else:
                client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=MASTER_KEY,
                                                  max_retries=0)
                with pytest.raises(anthropic.APIStatusError) as caught_a:
                    await client.messages.create(
                        model="claude-test", max_tokens=5, stream=True,
                        messages=[{"role": "user", "content": "hi"}])
                assert caught_a.value.status_code == 502
                body = caught_a.value.body
                assert isinstance(body, dict) and body.get("type") == "error", body
    assert usage.growth < 48 * MiB, usage


# ------------------------------------------------------------------ content coding


async def test_a_gzip_stream_that_was_not_asked_for_is_refused(
    gateway: Gateway, hostile: Hostile
) -> None:
    """The gateway asks for ``identity``: a gzip-coded answer is refused (502), never
    inflated, even when it would decode to a valid stream."""
    stream_body = gzip.compress(chat_chunk("hello") + b"data: [DONE]\n\n")

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(STREAM_HEAD.replace(b"\r\n\r\n", b"\r\ncontent-encoding: gzip"
                                                  b"\r\n\r\n", 1))
        await stream.send_all(chunked(stream_body) + b"0\r\n\r\n")

    hostile.script = answer
    with trio.fail_after(30):
        with pytest.raises(openai.APIStatusError) as caught:
            await openai_client(gateway).chat.completions.create(
                model="gpt-test", max_tokens=5, stream=True,
                messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 502
        await settled_as_upstream_error(gateway)
    assert b"accept-encoding: identity" in hostile.heads[0].lower()


async def test_a_gzip_bomb_costs_nothing(gateway: Gateway, hostile: Hostile) -> None:
    """About 100 KiB on the wire, in 4 KiB chunks, that would inflate to 100 MiB without
    a line end (decoded a chunk at a time: a megabyte per read, scanned again each)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"x" * MiB
    bomb = b"".join([packer.compress(zeros) for _ in range(100)]) + packer.flush()

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(STREAM_HEAD.replace(b"\r\n\r\n", b"\r\ncontent-encoding: gzip"
                                                  b"\r\n\r\n", 1))
        for at in range(0, len(bomb), 4096):
            await stream.send_all(chunked(bomb[at:at + 4096]))
        await stream.send_all(b"0\r\n\r\n")

    hostile.script = answer
    with trio.fail_after(30):
        async with measured() as usage:
            with pytest.raises(openai.APIStatusError):
                await openai_client(gateway).chat.completions.create(
                    model="gpt-test", max_tokens=5, stream=True,
                    messages=[{"role": "user", "content": "hi"}])
    assert usage.growth < 32 * MiB, usage
    assert usage.cpu_s < 2, usage


# ------------------------------------------------------------------ SSE lines


async def test_a_stream_line_without_end_costs_linear_cpu_and_is_bounded(
    gateway: Gateway, hostile: Hostile
) -> None:
    """One event, then a 32 MiB line without a newline in 64 KiB writes: the stream ends
    with an error event once the line passes the event bound, the upstream is dropped,
    and the CPU spent is a fraction of a second (a rescan per read was quadratic)."""
    line = b"x" * 65536

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(STREAM_HEAD + chunked(chat_chunk("one")))
        await stream.send_all(chunked(b"data: {\"choices\": \""))
        for _ in range(32 * MiB // len(line)):
            await stream.send_all(chunked(line))
        await stream.send_all(chunked(b"\"}\n\n") + b"0\r\n\r\n")

    hostile.script = answer
    with trio.fail_after(60):
        async with measured() as usage:
            stream = await openai_client(gateway).chat.completions.create(
                model="gpt-test", max_tokens=5, stream=True,
                messages=[{"role": "user", "content": "hi"}])
            with pytest.raises(openai.APIError):
                async for _ in stream:
                    pass
        await settled_as_upstream_error_stream(gateway)
    assert hostile.dropped == 1
    assert usage.cpu_s < 3, usage
    assert usage.growth < 48 * MiB, usage


async def settled_as_upstream_error_stream(gateway: Gateway) -> None:
    rows = await spend_rows(gateway, 1)
    assert rows[0].status == "error", rows


# ------------------------------------------------------------------ framing


FRAMINGS = {
    "negative content-length": lambda body: (
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n" + body + b"\n"),
    "conflicting content-lengths": lambda body: (
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)),
    "content-length list": lambda body: (
        b"HTTP/1.1 200 OK\r\ncontent-length: 5, %d\r\n\r\n%s" % (len(body), body)),
    "content-length with underscore": lambda body: (
        b"HTTP/1.1 200 OK\r\ncontent-length: %s\r\n\r\n%s"
        % (_underscored(b"%d" % len(body)), body)),
    "content-length with plus": lambda body: (
        b"HTTP/1.1 200 OK\r\ncontent-length: +%d\r\n\r\n%s" % (len(body), body)),
    "chunk size 0x": lambda body: (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0x%x\r\n%s\r\n0\r\n\r\n"
        % (len(body), body)),
    "chunk size with underscore": lambda body: (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%s\r\n%s\r\n0\r\n\r\n"
        % (_underscored(b"%x" % len(body)), body)),
    "negative chunk size": lambda body: (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n-1\r\n\r\n"
        % (len(body), body)),
    "transfer-encoding gzip, chunked": lambda body: (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
        % (len(body), body)),
}


def _underscored(digits: bytes) -> bytes:
    """``digits`` with an underscore after the first (Python's int() still reads it)."""
    return digits[:1] + b"_" + digits[1:]


@pytest.mark.parametrize("framing", list(FRAMINGS))
async def test_invalid_framing_is_refused_as_h11_would(
    gateway: Gateway, hostile: Hostile, framing: str
) -> None:
    """Each of these decodes to the same valid answer if read leniently (int() takes
    "0x..", "1_0", "+5"; the last Content-Length wins): refused with 502 instead."""
    body = chat_completion("framed")

    async def answer(stream: trio.abc.Stream) -> None:
        await stream.send_all(FRAMINGS[framing](body))

    hostile.script = answer
    with trio.fail_after(30):
        await chat_502(gateway)
        await settled_as_upstream_error(gateway)
        await hostile.wait_dropped()
