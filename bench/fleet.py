"""The fleet's ceiling: governed throughput of three gateway hosts against one Redis and
against a three-primary Redis Cluster, side by side in one run, with Redis's CPU per
governed request.

    python bench/fleet.py                       # 10 s per measurement, one round
    python bench/fleet.py --seconds 20 --rounds 2 --connections 16

Needs root, iproute2 and iptables (network namespaces), redis-server and redis-cli,
PostgreSQL's initdb/pg_ctl, wrk. The set-up is the fleet test's (``tests/fleet``): one
network namespace per gateway host (``triogate serve --workers 2``), one for Redis, one
for PostgreSQL, on a private bridge; the fake upstream and wrk run in the root
namespace. Redis keeps an AOF with ``appendfsync everysec`` (a production setting).

Each mode (``single``, ``cluster``) starts its Redis, the three hosts and their keys, warms
up, then runs two wrk processes per host (each with a key, team and end user of its own,
so budgets and limits of six principals spread over the cluster's slots) for
``--seconds``. Governance is on for every request: key, team and end-user budgets, RPM,
TPM and parallel limits (set high: nothing is refused), simple-shuffle routing. Redis's
CPU (user + system of every redis-server process, from ``/proc/<pid>/stat``) over the
measurement, divided by the governed requests answered 200, is its CPU per governed
request; ``1 / that`` is how many governed requests one Redis core could carry.

On a small machine the gateways, not Redis, set the throughput: the figure that carries
over to bigger fleets is the CPU per request, and the busy share shows how far Redis was
from its ceiling.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import load_procs as procs  # noqa: E402

from tests.chaos.harness import MASTER_KEY, write_config  # noqa: E402
from tests.fleet import netns  # noqa: E402
from tests.fleet.hosts import (  # noqa: E402
    GatewayHost,
    NsCluster,
    NsPostgres,
    NsRedis,
    cpu_seconds,
)

HOSTS = ("gw1", "gw2", "gw3")
WRK_PER_HOST = 2


def start_upstream(network: netns.Network, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The fake upstream, in the root namespace on the bridge's address."""
    port = procs.free_port()
    log = open(folder / "upstream.log", "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [sys.executable, "-m", "triogate.testing.fakeupstream", "--host", network.gateway_ip,
         "--port", str(port)], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    url = f"http://{network.gateway_ip}:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)  # any answer: it listens
            return process, url
        except httpx.TransportError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise
            time.sleep(0.1)


def principals(url: str, count: int, run: str) -> list[tuple[str, str]]:
    """``count`` (key, end user) pairs, each key in a team of its own."""
    made = []
    for i in range(count):
        team = procs.admin_post(url, MASTER_KEY, "/team/new",
                                {"team_alias": f"bench-{run}-{i}", "max_budget": 1_000_000})
        key = procs.admin_post(url, MASTER_KEY, "/key/generate", {
            "team_id": team["team_id"], "max_budget": 1_000_000, "rpm_limit": 10_000_000,
            "tpm_limit": 10_000_000_000, "max_parallel_requests": 10_000})
        user = f"bench-{run}-user-{i}"
        procs.admin_post(url, MASTER_KEY, "/customer/new",
                         {"user_id": user, "max_budget": 1_000_000})
        made.append((key["key"], user))
    return made


def run_wrk_all(hosts: list[GatewayHost], made: list[tuple[str, str]], *, connections: int,
                seconds: int, run: str, folder: Path) -> list[dict[str, Any]]:
    """Two wrk processes per host at once (each ``connections``), their summaries."""
    started = []
    for i, (key, user) in enumerate(made):
        host = hosts[i % len(hosts)]
        out = folder / f"wrk-{run}-{i}.json"
        env = {**os.environ, "WRK_AUTH": f"Bearer {key}", "WRK_MODEL": "gpt-chaos",
               "WRK_RUN": f"{run}-{i}-{time.monotonic_ns()}", "WRK_USER": user,
               "WRK_OUT": str(out)}
        argv = ["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds}s",
                "--timeout", "30s", "-s", str(procs.WRK_SCRIPT),
                f"{host.url}/v1/chat/completions"]
        started.append((subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE), out))
    summaries = []
    for process, out in started:
        _, err = process.communicate(timeout=seconds + 60)
        if process.returncode != 0 or not out.exists():
            raise procs.BenchError(f"wrk failed: {err.decode()[-1000:]}")
        summaries.append(json.loads(out.read_text()))
    return summaries


def measure(network: netns.Network, mode: str, folder: Path, upstream_url: str,
            database: str, args: argparse.Namespace, round_: int) -> dict[str, Any]:
    """One mode: start Redis and the hosts, warm up, measure, stop everything."""
    redis: NsRedis | NsCluster
    if mode == "single":
        redis = NsRedis(network, folder / f"redis-{mode}-{round_}", appendfsync="everysec")
    else:
        redis = NsCluster(network, folder / f"cluster-{round_}", primaries=3,
                          appendfsync="everysec")
    redis.start()
    hosts: list[GatewayHost] = []
    try:
        for name in HOSTS:
            config = folder / f"{mode}-{round_}-{name}.yaml"
            write_config(config, state=folder / f"state-{mode}-{round_}-{name}",
                         redis_url=redis.url, database=database, upstream_url=upstream_url)
            settings = yaml.safe_load(config.read_text())
            settings["triogate"]["redis"]["timeout_s"] = 2.0
            config.write_text(yaml.safe_dump(settings))
            hosts.append(GatewayHost(network, name, config,
                                     folder / f"{mode}-{round_}-{name}.log",
                                     workers=args.workers))
        for host in hosts:
            host.wait_ready()
        run = f"{mode}{round_}"
        made = principals(hosts[0].url, len(HOSTS) * WRK_PER_HOST, run)
        run_wrk_all(hosts, made, connections=args.connections, seconds=2, run=f"{run}w",
                    folder=folder)
        pids = redis.pids()
        gateway_pids = [p for name in HOSTS for p in network.pids(name)]
        cpu_before = sum(cpu_seconds(p) for p in pids)
        gateway_before = sum(cpu_seconds(p) for p in gateway_pids)
        wall_before = time.monotonic()
        summaries = run_wrk_all(hosts, made, connections=args.connections,
                                seconds=args.seconds, run=run, folder=folder)
        wall = time.monotonic() - wall_before
        redis_cpu = sum(cpu_seconds(p) for p in pids) - cpu_before
        gateway_cpu = sum(cpu_seconds(p) for p in gateway_pids) - gateway_before
    finally:
        for host in hosts:
            host.stop()
        redis.stop()
    requests = sum(s["requests"] for s in summaries)
    refused = sum(s["errors"]["status"] for s in summaries)
    errors = sum(v for s in summaries for k, v in s["errors"].items() if k != "status")
    governed = requests - refused
    duration = max(s["duration_us"] for s in summaries) / 1e6
    return {
        "mode": mode, "round": round_, "seconds": round(duration, 2),
        "governed_rps": round(governed / duration, 1), "non_200": refused,
        "socket_errors": errors,
        "p50_ms": round(max(s["latency_us"]["p50"] for s in summaries) / 1000, 2),
        "redis_cpu_s": round(redis_cpu, 3), "redis_busy": round(redis_cpu / wall, 3),
        "redis_us_per_request": round(redis_cpu / governed * 1e6, 1) if governed else None,
        "per_redis_core_rps": round(governed / redis_cpu) if redis_cpu else None,
        "gateway_cores": round(gateway_cpu / wall, 2),
        "gateway_us_per_request": round(gateway_cpu / governed * 1e6) if governed else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="per measurement")
    parser.add_argument("--rounds", type=int, default=1, help="single, cluster; repeated")
    parser.add_argument("--connections", type=int, default=8, help="per wrk process")
    parser.add_argument("--workers", type=int, default=2, help="per gateway host")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fleet.json")
    args = parser.parse_args()
    if (why := netns.missing()) is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="triogate-fleet-") as tmp:
        folder = Path(tmp)
        with netns.open_network([*HOSTS, "redis", "pg"]) as network:
            postgres = NsPostgres(network)
            upstream = None
            try:
                postgres.start()
                upstream, upstream_url = start_upstream(network, folder)
                for round_ in range(args.rounds):
                    for mode in ("single", "cluster"):
                        row = measure(network, mode, folder, upstream_url, postgres.url,
                                      args, round_)
                        print(json.dumps(row), flush=True)
                        rows.append(row)
            finally:
                if upstream is not None:
                    upstream.terminate()
                    upstream.wait(10)
                postgres.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"argv": sys.argv[1:], "canary_ms": procs.canary_ms(),
                                    "rows": rows}, indent=2) + "\n")
    print(f"{'mode':8} {'governed req/s':>15} {'Redis CPU µs/req':>17} {'Redis busy':>11} "
          f"{'req/s per Redis core':>21} {'gateway CPU µs/req':>19}")
    for row in rows:
        print(f"{row['mode']:8} {row['governed_rps']:>15} {row['redis_us_per_request']!s:>17} "
              f"{row['redis_busy']:>11} {row['per_redis_core_rps']!s:>21} "
              f"{row['gateway_us_per_request']!s:>19}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
