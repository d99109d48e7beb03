"""The gateway's upstream side of a stream alone: CPU per chunk read, decoded and re-encoded.

    python bench/stream_read.py TREE_A TREE_B --rounds 3

``bench/streams.py`` measures a whole worker (hypercorn, admission, Redis, settlement) on
a shared host, where a few percent drown in noise. This runs only what a stream chunk
costs between the upstream socket and the client write: the real upstream transport,
``OpenAIProvider.stream`` (SSE decoding, usage tracking, translation) and the loop of
``flow.py``'s producer (bursts joined, an event the upstream wrote as the client's API
would passed on as its bytes, the rest encoded with ``api/sse.py``; with ``--cache`` also
the response cache's assembly of the answer: event by event in a tree with
``cache.replay.assembler``, else the kept bytes decoded and assembled at the end), against
``bench/streamtool.c upstream``, in one process per tree, the trees alternating. The
client write is left out (``bench/send_floor.py`` measures hypercorn's send).

Per tree and round: process CPU for ``--streams`` streams of ``--chunks`` chunks minus
that of ``--baseline-chunks`` chunks, divided by the chunk difference.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

BENCH = Path(__file__).resolve().parent


async def _run(port: int, streams: int, chunks: int, api: str, cache: bool) -> float:
    import trio

    from triogate.api import sse
    from triogate.cache import replay

    # A tree whose producer folds each event into the answer as it passes (w10), or one
    # that keeps every event's wire bytes and decodes them again at the end.
    assembler = getattr(replay, "assembler", None)
    if assembler is None:
        from triogate.api.flow import _decoded
    from triogate.config import Deployment, Price
    from triogate.providers import new_upstream_client
    from triogate.providers.openai import OpenAIProvider

    deployment = Deployment(
        id="up-1", group="g", provider="openai", upstream_model="up-a",
        api_base=f"http://127.0.0.1:{port}/v1", api_key="sk-upstream", rpm=None, tpm=None,
        timeout_s=60, stream_timeout_s=60, weight=1.0, price=Price(), mode="chat",
        mock=None, info={})
    request: dict[str, Any] = {"model": "g", "max_tokens": chunks, "stream": True,
                               "messages": [{"role": "user", "content": "read bench"}]}
    written = 0

    async def one(provider: OpenAIProvider) -> None:
        nonlocal written
        kept: list[Any] = []
        assembly = assembler(api) if cache and assembler is not None else None
        async with provider.stream(api, request, deployment) as stream:  # type: ignore[arg-type]
            events = stream.__aiter__()
            event = await anext(events, None)
            while event is not None:
                burst: list[bytes] = []
                while event is not None:
                    # As flow.py's producer: an event the upstream wrote as the client's
                    # API would goes on as its bytes (kept as them before w10; folded
                    # into the answer as it passes since).
                    wire = getattr(stream, "wire", None)
                    if assembler is None:
                        kept.append(event if wire is None else wire)
                    elif assembly is not None:
                        assembly.feed(event)
                    burst.append(wire if wire is not None
                                 else sse.encode(api, event))  # type: ignore[arg-type]
                    event = stream.next_nowait()
                written += len(b"".join(burst))
                event = await anext(events, None)
        if assembly is not None:  # what a worker with the response cache does at the end
            assert assembly.result() is not None
        elif cache:
            assert replay.assemble(api, _decoded(kept)) is not None  # type: ignore[arg-type]

    async with new_upstream_client(max_connections=streams) as client:
        provider = OpenAIProvider(client)
        async with trio.open_nursery() as nursery:  # warm-up: connections, imports
            for _ in range(streams):
                nursery.start_soon(one, provider)
        start = time.process_time()
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for _ in range(streams):
                    nursery.start_soon(one, provider)
        return time.process_time() - start


def child(a: argparse.Namespace) -> int:
    import trio

    cpu = {c: trio.run(_run, a.port, a.streams, c, a.api, a.cache)
           for c in (a.chunks, a.baseline_chunks)}
    per_chunk = (cpu[a.chunks] - cpu[a.baseline_chunks]) * 1e6 / (
        a.streams * (a.chunks - a.baseline_chunks))
    cpu_s = {str(k): v for k, v in cpu.items()}
    print(orjson.dumps({"cpu_s": cpu_s, "us_per_chunk": per_chunk}).decode())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="*", type=Path)
    p.add_argument("--streams", type=int, default=128)
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--baseline-chunks", type=int, default=10)
    p.add_argument("--interval-ms", type=float, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--api", default="chat", choices=("chat", "messages", "responses"))
    p.add_argument("--cache", action="store_true",
                   help="also assemble the answer (event by event, or from the kept events "
                   "at the end in an older tree), as a worker whose response cache stores "
                   "streamed answers does")
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.port:
        return child(a)
    sys.path.insert(0, str(BENCH))
    import load_procs as procs
    import streams

    tool = streams.build_tool()
    port = procs.free_port()
    upstream = subprocess.Popen([str(tool), "upstream", str(port), str(a.interval_ms)],
                                stdout=subprocess.DEVNULL)
    results: dict[str, list[float]] = {str(t): [] for t in a.trees}
    try:
        time.sleep(0.5)
        for r in range(a.rounds):
            for tree in a.trees:
                env = {**os.environ, "PYTHONPATH": str(tree)}
                out = subprocess.run(
                    [sys.executable, __file__, "--port", str(port),
                     "--streams", str(a.streams), "--chunks", str(a.chunks),
                     "--baseline-chunks", str(a.baseline_chunks), "--api", a.api,
                     *(["--cache"] if a.cache else [])],
                    env=env, capture_output=True, check=True, timeout=600)
                figure = orjson.loads(out.stdout.splitlines()[-1])["us_per_chunk"]
                results[str(tree)].append(figure)
                print(f"round {r + 1} {tree}: {figure:.1f} us per chunk", flush=True)
    finally:
        upstream.terminate()
        upstream.wait(10)
    first = statistics.median(results[str(a.trees[0])])
    for tree in a.trees:
        median = statistics.median(results[str(tree)])
        print(f"{tree}: median {median:.1f} us per chunk, ratio to the first tree "
              f"{median / first:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
