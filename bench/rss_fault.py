"""Where a gateway's memory goes during a Redis pause: one gateway process run under
tracemalloc (a thread in this script's launcher only dumps a snapshot on request),
load from the chaos harness's clients, Redis paused (SIGSTOP) under load, then settled.
Prints RSS and tracemalloc's current size at each point and the top growers by traceback.

    python3 bench/rss_fault.py --pause 3 --clients 24
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tracemalloc
from functools import partial
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.harness import (
    AofRedis,
    GatewayProcess,
    LoadStats,
    client_loop,
    create_principals,
    free_port,
    write_config,
)
from triogate.testing.fakeupstream import open_fake_upstream

LAUNCHER = """
import os, runpy, sys, threading, time, tracemalloc
tracemalloc.start(12)
def watch(path):
    while True:
        time.sleep(0.1)
        if os.path.exists(path + ".want"):
            os.unlink(path + ".want")
            tracemalloc.take_snapshot().dump(path)
            open(path + ".done", "w").close()
threading.Thread(target=watch, args=(sys.argv[1],), daemon=True).start()
sys.argv = ["triogate", *sys.argv[2:]]
runpy.run_module("triogate", run_name="__main__")
"""


class TracedGateway(GatewayProcess):
    def __init__(self, config: Path, log: Path, dump: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.dump_path = dump
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOGATE_")}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, str(dump), "serve", "--config", str(config),
                 "--port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)

    async def snapshot(self) -> tracemalloc.Snapshot:
        done = Path(str(self.dump_path) + ".done")
        done.unlink(missing_ok=True)
        Path(str(self.dump_path) + ".want").touch()
        with trio.fail_after(120):
            while not done.exists():
                await trio.sleep(0.1)
        return tracemalloc.Snapshot.load(str(self.dump_path))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def report(label: str, pid: int, snap: tracemalloc.Snapshot) -> None:
    traced = sum(s.size for s in snap.statistics("filename")) // 1024
    print(f"{label}: RSS {rss_kib(pid)} KiB, tracemalloc current {traced} KiB", flush=True)


def top(new: tracemalloc.Snapshot, old: tracemalloc.Snapshot, n: int) -> None:
    for stat in new.compare_to(old, "traceback")[:n]:
        print(f"  {stat.size_diff / 1024:+8.1f} KiB {stat.count_diff:+6d} blocks")
        for line in stat.traceback.format(limit=4, most_recent_first=True):
            print("     ", line.strip())


async def run(args: argparse.Namespace, folder: Path) -> None:
    redis = AofRedis(folder / "redis")
    await redis.start()
    gateway: TracedGateway | None = None
    try:
        async with open_fake_upstream() as upstream:
            config = folder / "gateway.yaml"
            write_config(config, state=folder / "state", redis_url=redis.url,
                         database=folder / "spend.db", upstream_url=upstream.base_url)
            gateway = TracedGateway(config, folder / "gateway.log", folder / "snap")
            await gateway.wait_ready(60)
            made = await create_principals(gateway.url)
            stats = LoadStats()
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                for c in range(args.clients):
                    nursery.start_soon(partial(client_loop, [gateway.url], made, stats, stop,
                                               seed=c, stream_share=0.4,
                                               disconnect_share=0.25))
                await trio.sleep(args.warm)
                before = await gateway.snapshot()
                report("before pause", gateway.process.pid, before)
                sent = stats.sent
                redis.pause()
                await trio.sleep(args.pause)
                redis.resume()
                await trio.sleep(args.settle)
                after = await gateway.snapshot()
                report(f"after {args.pause} s pause + {args.settle} s", gateway.process.pid,
                       after)
                print(f"requests during that window: {stats.sent - sent}")
                top(after, before, args.top)
                stop.set()
                nursery.cancel_scope.cancel()
            await gateway.wait_settled(60)
            late = await gateway.snapshot()
            report("load stopped, settled", gateway.process.pid, late)
            top(late, before, args.top)
            await gateway.stop()
    finally:
        if gateway is not None:
            gateway.kill()
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--warm", type=float, default=20)
    parser.add_argument("--pause", type=float, default=3)
    parser.add_argument("--settle", type=float, default=10)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="triogate-rssfault-") as folder:
        trio.run(run, args, Path(folder))


if __name__ == "__main__":
    main()
