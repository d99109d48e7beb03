"""Soak: two gateway processes under mixed load for minutes, a Redis fault every 30 s;
RSS and open file descriptors over time (they must stay flat), money checked at the end.

Two ``python -m triogate serve`` processes share one redis-server (AOF, ``appendfsync
always``) and one SQLite database. Clients send chats and streams, some streams are
abandoned mid-way (the client disconnects). Every ``--fault-every-s`` one fault, in turn:
``CLIENT KILL TYPE normal``; SIGSTOP for 2 s; kill -9 and restart after 2 s; a restart that
answers LOADING for a while; ``CONFIG SET timeout 1`` for 10 s (idle pooled connections
closed by the server). At the end, for every key, team and end user, Redis spend must
equal the sum of the spend-log rows, with nothing reserved or held.

    python bench/soak.py --minutes 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.harness import (
    AofRedis,
    GatewayProcess,
    LoadStats,
    client_loop,
    create_principals,
    money_check,
    pad_and_rewrite,
    wait_loaded,
    write_config,
)
from triogate.batch import BackendUnavailable, RespBackend
from triogate.testing.fakeupstream import open_fake_upstream

#: The data set grows with the run (a routing marker per request lives 10 min), and a slow
#: restart loads every key slowly: 4 s after 2 minutes, 19 s after 5 (a 30 s wait failed a
#: 10-minute soak at its third slow restart).
LOAD_TIMEOUT_S = 180.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def fault(redis: AofRedis, n: int, padded: list[bool]) -> str:
    """The n-th fault of the rotation; returns its description."""
    admin = RespBackend(redis.url, command_timeout_s=5)
    try:
        kind = n % 5
        if kind == 0:
            await admin.execute([("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")])
            return "client kill"
        if kind == 1:
            redis.pause()
            await trio.sleep(2)
            redis.resume()
            return "SIGSTOP 2 s"
        if kind == 2:
            redis.kill()
            await trio.sleep(2)
            await redis.start()
            await wait_loaded(admin, LOAD_TIMEOUT_S)
            return "kill -9, restart after 2 s"
        if kind == 3:
            if not padded:
                await pad_and_rewrite(admin)
                padded.append(True)
            redis.kill()
            await redis.start(slow_load=True)
            loading_s = await wait_loaded(admin, LOAD_TIMEOUT_S)
            return f"kill -9, restart answering LOADING for {loading_s:.1f} s"
        await admin.execute([("CONFIG", "SET", "timeout", "1")])
        await trio.sleep(10)
        await admin.execute([("CONFIG", "SET", "timeout", "0")])
        return "server timeout 1 s for 10 s"
    except BackendUnavailable as exc:
        return f"fault {n} incomplete: {exc}"
    finally:
        await admin.aclose()


async def soak(minutes: float, fault_every_s: float, clients: int, sample_every_s: float,
               folder: Path) -> int:
    redis = AofRedis(folder / "redis")
    await redis.start()
    database = folder / "spend.db"
    gateways: list[GatewayProcess] = []
    try:
        async with open_fake_upstream() as upstream:
            for i in range(2):
                config = folder / f"gateway-{i}.yaml"
                write_config(config, state=folder / f"state-{i}", redis_url=redis.url,
                             database=database, upstream_url=upstream.base_url)
                gateways.append(GatewayProcess(config, folder / f"gateway-{i}.log"))
            for gateway in gateways:
                await gateway.wait_ready()
            made = await create_principals(gateways[0].url)
            stats = LoadStats()
            faults: list[str] = []
            samples: list[tuple[float, list[int], list[int]]] = []
            stop = trio.Event()
            started = trio.current_time()
            print(f"soak: {minutes} min, {clients} clients, a fault every {fault_every_s} s; "
                  f"logs in {folder}", flush=True)
            print(f"{'t (s)':>6} {'sent':>7} {'RSS KiB (gw0, gw1)':>20} {'fds (gw0, gw1)':>15}",
                  flush=True)

            async def sampler() -> None:
                while not stop.is_set():
                    pids = [g.process.pid for g in gateways]
                    sample = (trio.current_time() - started, [rss_kib(p) for p in pids],
                              [open_fds(p) for p in pids])
                    samples.append(sample)
                    print(f"{sample[0]:6.0f} {stats.sent:7d} {sample[1]!s:>20} "
                          f"{sample[2]!s:>15}", flush=True)
                    await trio.sleep(sample_every_s)

            async def faulter() -> None:
                n = 0
                padded: list[bool] = []
                while True:
                    await trio.sleep(fault_every_s)
                    if trio.current_time() - started > minutes * 60 - 10:
                        return
                    faults.append(await fault(redis, n, padded))
                    print(f"{trio.current_time() - started:6.0f} fault: {faults[-1]}",
                          flush=True)
                    n += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sampler)
                for c in range(clients):
                    nursery.start_soon(partial(client_loop, [g.url for g in gateways], made,
                                               stats, stop, seed=c, stream_share=0.4,
                                               disconnect_share=0.25))
                nursery.start_soon(faulter)
                await trio.sleep(minutes * 60)
                stop.set()
                nursery.cancel_scope.cancel()
            for gateway in gateways:
                await gateway.wait_settled(60)
            codes = [await g.stop() for g in gateways]
            report = await money_check(redis.url, database, made)
    finally:
        for gateway in gateways:
            gateway.kill()
        redis.stop()
    answered = sum(stats.statuses.values())
    print(f"\nrequests sent {stats.sent}, answered {answered} {dict(stats.statuses)}, "
          f"streams {stats.streams}, client disconnects {stats.disconnects}, "
          f"transport errors {stats.transport_errors}")
    print(f"faults injected ({len(faults)}): {'; '.join(faults)}")
    warm = [s for s in samples if s[0] >= 30] or samples
    for i in range(2):
        rss = [s[1][i] for s in warm]
        fds = [s[2][i] for s in warm]
        print(f"gateway {i}: RSS after warm-up {min(rss)}..{max(rss)} KiB "
              f"(first {rss[0]}, last {rss[-1]}); open fds {min(fds)}..{max(fds)} "
              f"(first {fds[0]}, last {fds[-1]}); exit code {codes[i]}")
    print(f"spend-log rows {report.rows}, principals checked {report.principals}, "
          f"spend {report.spend_nanousd} nano-USD")
    print(f"discrepancies: {len(report.discrepancies)}")
    for line in report.discrepancies:
        print("  " + line)
    return 1 if report.discrepancies or codes != [0, 0] else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--fault-every-s", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--sample-every-s", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the logs and data folder")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="triogate-soak-"))
    try:
        code = trio.run(soak, args.minutes, args.fault_every_s, args.clients,
                        args.sample_every_s, folder)
    finally:
        if not args.keep:
            import shutil
            shutil.rmtree(folder, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
