"""A minute of mixed load through an upstream that answers each request with a shape
chosen at random: a good answer, a body that never ends, a content coding nobody asked
for, a stream line without an end, invalid framing, a stream that trickles past its
timeout, a runaway stream, silence. The gateway is its own process (``triogate serve``).

Throughout, the worker's RSS stays under 300 MiB; every request is answered (a status
line; some streams are left by their clients halfway); afterwards every key's, team's
and end user's spend equals its spend-log rows and nothing stays reserved or held.
"""

from __future__ import annotations

import contextlib
import gzip
import random
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio
import yaml

from tests.chaos.harness import (
    MASTER_KEY,
    UPSTREAM_KEY,
    GatewayProcess,
    LoadStats,
    client_loop,
    create_principals,
    money_check,
)
from tests.e2e.hostile_upstream import (
    PAGE_SIZE,
    STREAM_HEAD,
    Hostile,
    chat_chunk,
    chat_completion,
    chunked,
    json_head,
    serve_hostile,
)

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

DURATION_S = 60.0
CLIENTS = 6
MAX_RSS = 300 * 1024 * 1024
MiB = 1024 * 1024

SHAPES = ("good", "good", "good", "endless", "gzip", "long line", "framing", "trickle",
          "runaway", "silent")


def _usage_chunk() -> bytes:
    return b"data: " + orjson.dumps({
        "id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 1700000000,
        "model": "gpt-up", "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}) + b"\n\n"


class Shapes:
    """The hostile upstream's answers, one shape per request, chosen at random."""

    def __init__(self, hostile: Hostile, seed: int) -> None:
        self.hostile = hostile
        self.rng = random.Random(seed)
        self.counts: dict[str, int] = dict.fromkeys(SHAPES, 0)
        # ~64 KiB on the wire, 64 MiB inflated (made once: compressing costs).
        self.bomb = gzip.compress(b"{" + b" " * (64 * MiB) + b"}", 9)

    async def answer(self, stream: trio.abc.Stream) -> None:
        shape = self.rng.choice(SHAPES)
        self.counts[shape] += 1
        streamed = b'"stream":true' in self.hostile.bodies[-1]
        await getattr(self, "_" + shape.replace(" ", "_"))(stream, streamed)

    async def _good(self, stream: trio.abc.Stream, streamed: bool) -> None:
        if streamed:
            await stream.send_all(STREAM_HEAD + chunked(chat_chunk("fine")) + chunked(
                chat_chunk("", "stop")) + chunked(_usage_chunk())
                + chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        else:
            body = chat_completion("fine", 3)
            await stream.send_all(json_head(len(body)) + body)

    async def _endless(self, stream: trio.abc.Stream, streamed: bool) -> None:
        piece = chunked(b"x" * 65536)
        await stream.send_all(STREAM_HEAD if streamed else json_head(None))
        for _ in range(128 * MiB // 65536):  # the test's own guard
            await stream.send_all(piece)

    async def _gzip(self, stream: trio.abc.Stream, streamed: bool) -> None:
        body = self.bomb
        head = STREAM_HEAD if streamed else json_head(None)
        await stream.send_all(head.replace(b"\r\n\r\n", b"\r\ncontent-encoding: gzip\r\n\r\n")
                              + chunked(body) + b"0\r\n\r\n")

    async def _long_line(self, stream: trio.abc.Stream, streamed: bool) -> None:
        if not streamed:
            return await self._endless(stream, streamed)
        await stream.send_all(STREAM_HEAD + chunked(chat_chunk("a")) + chunked(b"data: {"))
        for _ in range(64 * MiB // 65536):
            await stream.send_all(chunked(b"y" * 65536))
        return None

    async def _framing(self, stream: trio.abc.Stream, streamed: bool) -> None:
        body = chat_completion("framed")
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: %d"
                              b"\r\n\r\n%s" % (len(body), body))

    async def _trickle(self, stream: trio.abc.Stream, streamed: bool) -> None:
        if streamed:
            await stream.send_all(STREAM_HEAD)
            while True:
                await stream.send_all(chunked(chat_chunk("t")))
                await trio.sleep(0.3)
        await stream.send_all(json_head(None))
        while True:
            await stream.send_all(chunked(b" "))
            await trio.sleep(0.3)

    async def _runaway(self, stream: trio.abc.Stream, streamed: bool) -> None:
        if not streamed:
            return await self._good(stream, streamed)
        await stream.send_all(STREAM_HEAD)
        for _ in range(1_000_000):
            await stream.send_all(chunked(chat_chunk("more words ")))
            await trio.sleep(0.002)
        return None

    async def _silent(self, stream: trio.abc.Stream, streamed: bool) -> None:
        await trio.sleep_forever()


async def process_rss(pid: int) -> int:
    """The resident set of ``pid`` and its children (the workers, if any)."""
    total = 0
    pids = [pid]
    children = trio.Path(f"/proc/{pid}/task/{pid}/children")
    with contextlib.suppress(OSError):
        pids += [int(p) for p in (await children.read_text()).split()]
    for one in pids:
        with contextlib.suppress(OSError, IndexError):
            total += int((await trio.Path(f"/proc/{one}/statm").read_text()).split()[1])
    return total * PAGE_SIZE


def write_config(path: Path, *, state: Path, redis_url: str, database: Path,
                 upstream_url: str) -> None:
    priced = {"input_cost_per_token": "0.000001", "output_cost_per_token": "0.000002",
              "api_base": f"{upstream_url}/v1", "api_key": UPSTREAM_KEY,
              "timeout": 4, "stream_timeout": 3}
    path.write_text(yaml.safe_dump({
        "model_list": [
            {"model_name": "gpt-chaos", "litellm_params": {"model": "openai/up-a", **priced},
             "model_info": {"id": "a"}},
            {"model_name": "gpt-chaos", "litellm_params": {"model": "openai/up-b", **priced},
             "model_info": {"id": "b"}},
        ],
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 1,
                            "allowed_fails": 1_000_000, "cooldown_time": 0},
        "general_settings": {"master_key": MASTER_KEY,
                             "database_url": f"sqlite:///{database}"},
        "triogate": {"state_dir": str(state), "redis": {"url": redis_url, "timeout_s": 2},
                     "shutdown_grace_s": 10},
    }))


async def test_mixed_load_through_hostile_upstreams(
    tmp_path: Path, redis: RespBackend, redis_url: str
) -> None:
    hostile = Hostile()
    shapes = Shapes(hostile, seed=7)
    hostile.script = shapes.answer
    database = tmp_path / "spend.db"
    config = tmp_path / "gateway.yaml"
    peak = 0
    async with trio.open_nursery() as servers:
        await serve_hostile(servers, hostile)
        write_config(config, state=tmp_path / "state", redis_url=redis_url,
                     database=database, upstream_url=hostile.url)
        gateway = GatewayProcess(config, tmp_path / "gateway.log")
        try:
            with trio.fail_after(DURATION_S + 90):
                await gateway.wait_ready()
                made = await create_principals(gateway.url)
                stats = LoadStats()
                stop = trio.Event()

                async def watch_rss() -> None:
                    nonlocal peak
                    while not stop.is_set():
                        peak = max(peak, await process_rss(gateway.process.pid))
                        await trio.sleep(0.05)

                async with trio.open_nursery() as load:
                    load.start_soon(watch_rss)
                    for c in range(CLIENTS):
                        load.start_soon(partial(client_loop, [gateway.url], made, stats,
                                                stop, seed=c, stream_share=0.5,
                                                disconnect_share=0.1))
                    await trio.sleep(DURATION_S)
                    stop.set()
                await gateway.wait_settled()
                code = await gateway.stop()
                report = await money_check(redis_url, database, made)
        finally:
            gateway.kill()
            servers.cancel_scope.cancel()
    answered = sum(stats.statuses.values())
    summary: dict[str, Any] = {
        "sent": stats.sent, "answered": answered, "statuses": dict(stats.statuses),
        "transport_errors": stats.transport_errors, "shapes": shapes.counts,
        "peak_rss_mib": round(peak / MiB, 1), "rows": report.rows}
    print(f"\n{summary}")
    for line in report.discrepancies:
        print("  " + line)
    assert code == 0
    assert stats.sent > 50, summary
    assert stats.transport_errors == 0 and answered == stats.sent, summary
    assert peak < MAX_RSS, summary
    assert not report.discrepancies, report.discrepancies
