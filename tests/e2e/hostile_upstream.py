"""An upstream on loopback that answers with whatever bytes a test gives it (raw sockets,
no HTTP library): malformed framing, endless bodies, content codings nobody asked for,
trickled streams. With a server TLS context it speaks https.

Also what the hostile-upstream tests measure: the process's RSS, sampled while a test
runs (the gateway runs in the test's process), and its CPU time.
"""

from __future__ import annotations

import contextlib
import re
import ssl
import time
from functools import partial
from typing import TYPE_CHECKING

import attrs
import orjson
import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

PAGE_SIZE = 4096


@attrs.define
class Hostile:
    """Answers every request with ``script``; counts requests and the connections the
    gateway closed (``dropped``: while the script wrote, or before another request)."""

    script: Callable[[trio.abc.Stream], Awaitable[None]] | None = None
    port: int = 0
    requests: int = 0
    dropped: int = 0
    bodies: list[bytes] = attrs.Factory(list)
    heads: list[bytes] = attrs.Factory(list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_dropped(self) -> None:
        """Until the gateway has closed a connection (the caller bounds the wait)."""
        while not self.dropped:
            await trio.sleep(0.01)

    async def handle(self, stream: trio.abc.Stream) -> None:
        try:
            while True:
                head, body = await read_request(stream)
                if head is None:
                    self.dropped += 1
                    return
                self.requests += 1
                self.heads.append(head)
                self.bodies.append(body)
                assert self.script is not None
                await self.script(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            self.dropped += 1
        finally:
            await trio.aclose_forcefully(stream)


async def read_request(stream: trio.abc.Stream) -> tuple[bytes | None, bytes]:
    """One request's head and body off ``stream`` (None at the connection's end)."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = await stream.receive_some(65536)
        if not more:
            return None, b""
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    found = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    length = int(found.group(1)) if found else 0
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head, body


async def serve_hostile(nursery: trio.Nursery, hostile: Hostile,
                        ssl_context: ssl.SSLContext | None = None) -> None:
    """Start ``hostile`` on a loopback port (``hostile.port``)."""
    handler = hostile.handle
    if ssl_context is not None:
        async def handler(stream: trio.abc.Stream) -> None:  # type: ignore[misc]
            tls = trio.SSLStream(stream, ssl_context, server_side=True)
            await hostile.handle(tls)
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    hostile.port = listeners[0].socket.getsockname()[1]


@contextlib.asynccontextmanager
async def open_hostile() -> AsyncIterator[Hostile]:
    """A :class:`Hostile` served in a nursery of the caller's task; stopped on exit."""
    hostile = Hostile()
    async with trio.open_nursery() as nursery:
        await serve_hostile(nursery, hostile)
        yield hostile
        nursery.cancel_scope.cancel()


def chat_completion(content: str = "hi", completion_tokens: int = 1) -> bytes:
    """A chat completion body."""
    return orjson.dumps({
        "id": "chatcmpl-h", "object": "chat.completion", "created": 1700000000,
        "model": "gpt-up", "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": completion_tokens,
                  "total_tokens": 3 + completion_tokens}})


def chat_chunk(text: str, finish_reason: str | None = None) -> bytes:
    """One chat stream event (``data: ...`` and a blank line)."""
    return b"data: " + orjson.dumps({
        "id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 1700000000,
        "model": "gpt-up", "choices": [{"index": 0, "delta": {"content": text},
                                        "finish_reason": finish_reason}]}) + b"\n\n"


def chunked(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
               b"transfer-encoding: chunked\r\n\r\n")


def json_head(length: int | None, extra: bytes = b"") -> bytes:
    framing = b"transfer-encoding: chunked" if length is None else b"content-length: %d" % length
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + framing + b"\r\n" + (
        extra + b"\r\n\r\n" if extra else b"\r\n")


@attrs.define
class Usage:
    """Peak RSS (bytes) sampled while the block ran, and the CPU time it took."""

    base_rss: int = 0
    peak_rss: int = 0
    cpu_s: float = 0.0

    @property
    def growth(self) -> int:
        return self.peak_rss - self.base_rss


async def rss_bytes() -> int:
    """This process's resident set (``/proc/self/statm``)."""
    text = await trio.Path("/proc/self/statm").read_text()
    return int(text.split()[1]) * PAGE_SIZE


async def sample_rss(usage: Usage, *, task_status: trio.TaskStatus[None]) -> None:
    """Sample RSS into ``usage`` every 20 ms until cancelled."""
    usage.base_rss = usage.peak_rss = await rss_bytes()
    task_status.started()
    while True:
        usage.peak_rss = max(usage.peak_rss, await rss_bytes())
        await trio.sleep(0.02)


@contextlib.asynccontextmanager
async def measured() -> AsyncIterator[Usage]:
    """``async with measured() as usage:`` samples RSS and counts CPU time in the block."""
    usage = Usage()
    async with trio.open_nursery() as nursery:
        await nursery.start(sample_rss, usage)
        cpu0 = time.process_time()
        try:
            yield usage
        finally:
            usage.cpu_s = time.process_time() - cpu0
            nursery.cancel_scope.cancel()
    usage.peak_rss = max(usage.peak_rss, await rss_bytes())
