"""Benchmarks of triogate.batch alone. Ratios matter, not absolutes.

    python bench/batch.py            # prints a Markdown table, writes bench/results/batch.json

1. Overhead of a batch scope with 5 participants and one round, against a backend that
   answers at once (pure library cost) and against a real server (one unix-socket wait).
2. One pipeline of 10 commands versus 10 sequential calls on the same connection, with
   triogate's RespBackend and with coredis on the same server.
3. The settler's group commit: network round trips per request at 1, 32 and 256
   concurrent requests, each closing a post-call batch of 4 commands.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from triogate.batch import RespBackend, Settler, open_batch_scope, open_post_call_batch
from triogate.batch.testing import RecordingBackend
from triogate.redis_server import SyncServer

OUT = Path(__file__).parent / "results"


async def scope_round(backends: dict[str, object]) -> None:
    async def participant(batch: object, i: int) -> object:
        return await batch.call("GET", keys=[f"k{i}"], owner=f"p{i}")  # type: ignore[attr-defined]

    async with open_batch_scope(backends) as scope:  # type: ignore[arg-type]
        for i in range(5):
            scope.start_participant(participant, scope.batch, i)


async def time_per_op(fn: object, n: int) -> float:
    """Median of 5 runs of n calls, in microseconds per call."""
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(n):
            await fn()  # type: ignore[operator]
        runs.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(runs)


async def pipeline_vs_sequential(url: str) -> dict[str, float]:
    import coredis
    from coredis.response._callbacks import NoopCallback

    resp = RespBackend(url, command_timeout_s=5)
    commands = [("GET", f"k{i}") for i in range(10)]

    async def resp_pipeline() -> None:
        await resp.execute(commands)

    async def resp_sequential() -> None:
        for command in commands:
            await resp.execute([command])

    client = coredis.Redis(unix_socket_path=url.removeprefix("unix://"))
    results: dict[str, float] = {}
    async with client:
        async def coredis_pipeline() -> None:
            async with client.pipeline(transaction=False, raise_on_error=False) as pipe:
                for name, key in commands:
                    pipe.create_request(name.encode(), key, callback=NoopCallback())

        async def coredis_sequential() -> None:
            for _, key in commands:
                await client.get(key)

        results["coredis: 1 pipeline of 10 (µs)"] = await time_per_op(coredis_pipeline, 300)
        results["coredis: 10 sequential (µs)"] = await time_per_op(coredis_sequential, 100)
    results["RespBackend: 1 pipeline of 10 (µs)"] = await time_per_op(resp_pipeline, 1000)
    results["RespBackend: 10 sequential (µs)"] = await time_per_op(resp_sequential, 300)
    await resp.aclose()
    return results


async def settler_round_trips(url: str, concurrency: int, requests: int) -> dict[str, float]:
    backend = RespBackend(url, command_timeout_s=5)
    settler = Settler({"default": backend})
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        started = time.perf_counter()

        async def client(i: int) -> None:
            for j in range(requests // concurrency):
                async with open_post_call_batch(settler, trace_id=f"{i}-{j}") as post:
                    for k in range(4):
                        post.call("INCRBY", keys=[f"c{k}"], args=[1], owner="bench")
                await post.wait_settled()

        async with trio.open_nursery() as clients:
            for i in range(concurrency):
                clients.start_soon(client, i)
        elapsed = time.perf_counter() - started
        stats = settler.statistics()
        nursery.cancel_scope.cancel()
    await backend.aclose()
    return {
        "concurrency": concurrency,
        "requests": stats.batches,
        "round trips": stats.flushes,
        "round trips per request": round(stats.flushes / stats.batches, 4),
        "requests/s": round(stats.batches / elapsed),
    }


async def main() -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        server = SyncServer(Path(folder))
        try:
            instant = {"default": RecordingBackend()}
            real = {"default": RespBackend(server.url, command_timeout_s=5)}
            results: dict[str, object] = {
                "scope, 5 participants, 1 round, instant backend (µs)":
                    round(await time_per_op(lambda: scope_round(instant), 2000), 1),
                "scope, 5 participants, 1 round, real server (µs)":
                    round(await time_per_op(lambda: scope_round(real), 1000), 1),
            }
            results.update({k: round(v, 1) for k, v in
                            (await pipeline_vs_sequential(server.url)).items()})
            results["settler"] = [
                await settler_round_trips(server.url, c, max(512, c * 4)) for c in (1, 32, 256)
            ]
        finally:
            server.stop()
    return results


if __name__ == "__main__":
    results = trio.run(main)
    OUT.mkdir(exist_ok=True)
    (OUT / "batch.json").write_text(json.dumps(results, indent=2) + "\n")
    for key, value in results.items():
        if key != "settler":
            print(f"| {key} | {value} |")
    print("\n| concurrency | requests | round trips | per request | requests/s |")
    print("|---|---|---|---|---|")
    for row in results["settler"]:  # type: ignore[union-attr]
        print(f"| {row['concurrency']} | {row['requests']} | {row['round trips']} | "
              f"{row['round trips per request']} | {row['requests/s']} |")
    sys.exit(0)
