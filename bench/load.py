"""Load benchmark: what the gateway adds to a direct call, with governance on.

    python bench/load.py              # full run (~12 min): results/load.{json,md,png}
    python bench/load.py --quick      # smoke run (~2.5 min), same outputs
    python bench/load.py --profile    # also: py-spy of one worker under load

Every part is its own process on loopback: a Redis-compatible server on TCP (the
valkey-server the gateway embeds), the fake upstream (``python -m triogate.testing.fakeupstream``,
``--latency-ms`` per answer), the gateway (``python -m triogate serve``, 1 then 2
workers), the delay proxy (``bench/delay_proxy.py``) and the load generator, wrk
(closed loop: each connection sends its next request when the last answer ended; a
Lua script gives every request its own prompt, so every request is a cache miss).

Measured for 1, 32 and 256 connections, non-streaming and streaming (wrk reads each SSE
stream to its last chunk: latency = time to the last byte): requests/s, p50/p99
latency, the same against the upstream directly, and their differences. Then one gateway
with its Redis behind the delay proxy: the same grid at +0 ms (the proxy's own cost) and
+1 ms per round trip, and a one-connection sweep over 0, 1 and 20 ms, interleaved in
short runs over many rounds (the host's speed drifts by more than a millisecond per
request between runs), whose slope counts the Redis waits on a request's latency path. Per request:
Redis scripts, commands and reads (the server's INFO), the settler's flushes per
post-call batch and the waits per request (the gateway's /metrics, 1-worker runs only:
/metrics reaches one worker at random), CPU per process, peak RSS per worker.

Governance on: key, team and end-user budgets, TPM/RPM limits (set high, so nothing is
refused), usage-based routing over two deployments, the response cache on. One variant
turns it off for comparison (the master key, so no key, team or end-user checks; cache
off; simple-shuffle routing, which still reads cooldowns from Redis).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import load_procs as procs
import load_report
import psutil
import yaml

from triogate.redis_server import find_server_binary

if TYPE_CHECKING:
    from collections.abc import Iterator

MASTER_KEY = "sk-bench-master"
UPSTREAM_KEY = "sk-upstream-bench"
GROUP = "bench-chat"
END_USER = "bench-customer"
OUT = Path(__file__).resolve().parent / "results"


def gateway_yaml(state_dir: Path, upstream: str) -> dict[str, Any]:
    def deployment(name: str) -> dict[str, Any]:
        return {"model_name": GROUP, "model_info": {"id": name}, "litellm_params": {
            "model": f"openai/{name}", "api_base": f"{upstream}/v1", "api_key": UPSTREAM_KEY,
            "input_cost_per_token": "0.000001", "output_cost_per_token": "0.000002",
            "rpm": 1_000_000_000, "tpm": 100_000_000_000}}

    return {
        "model_list": [deployment("up-a"), deployment("up-b")],
        "router_settings": {"routing_strategy": "usage-based-routing"},
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"cache": True, "cache_params": {"ttl": 600}},
        # No in-flight limit for the sweep (it measures how throughput holds up, not
        # refusals); the overload point sets one.
        "triogate": {"state_dir": str(state_dir), "max_in_flight": 0},
    }


def litellm_yaml(upstream: str, redis_port: int) -> dict[str, Any]:
    """The same two deployments for the LiteLLM proxy, with usage-based routing and the
    Redis response cache on the benchmark's Redis (master key only: LiteLLM's virtual keys
    need its PostgreSQL schema)."""
    def deployment(name: str) -> dict[str, Any]:
        return {"model_name": GROUP, "model_info": {"id": name}, "litellm_params": {
            "model": f"openai/{name}", "api_base": f"{upstream}/v1", "api_key": UPSTREAM_KEY,
            "rpm": 1_000_000_000, "tpm": 100_000_000_000}}

    redis = {"host": "127.0.0.1", "port": redis_port}
    return {
        "model_list": [deployment("up-a"), deployment("up-b")],
        "router_settings": {"routing_strategy": "usage-based-routing-v2",
                            "redis_host": "127.0.0.1", "redis_port": redis_port},
        "litellm_settings": {"cache": True, "set_verbose": False,
                             "cache_params": {"type": "redis", **redis, "ttl": 600}},
        "general_settings": {"master_key": MASTER_KEY},
    }


def provision(url: str) -> str:
    """Team, key, end user (budgets large, limits high: nothing is refused); the key."""
    team = procs.admin_post(url, MASTER_KEY, "/team/new", {
        "team_alias": "bench", "max_budget": 1_000_000, "budget_duration": "30d",
        "tpm_limit": 100_000_000_000, "rpm_limit": 1_000_000_000})
    key = procs.admin_post(url, MASTER_KEY, "/key/generate", {
        "team_id": team["team_id"], "max_budget": 100_000, "budget_duration": "1d",
        "tpm_limit": 10_000_000_000, "rpm_limit": 100_000_000})
    procs.admin_post(url, MASTER_KEY, "/customer/new", {
        "user_id": END_USER, "max_budget": 10_000, "rpm_limit": 100_000_000})
    return str(key["key"])


class Bench:
    """One run: the shared processes, and every measured point."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.logs = work / "logs"
        self.points: list[dict[str, Any]] = []
        self.sweep: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.rtt_ms: dict[str, float] = {}
        self.key: str | None = None
        self.profile: dict[str, Any] | None = None
        self.load_at_start = [round(x, 2) for x in os.getloadavg()]
        self.redis_port = 0

    def wrk_env(self, *, target: str, stream: bool, fixed: bool = False) -> dict[str, str]:
        """wrk's settings: ``target`` is ``direct``, ``governed`` (the virtual key and an
        end user) or ``master`` (the master key: no key, team or end-user checks)."""
        key = {"direct": UPSTREAM_KEY, "governed": self.key, "master": MASTER_KEY}[target]
        return {"WRK_AUTH": f"Bearer {key}", "WRK_MODEL": "up-a" if target == "direct" else GROUP,
                "WRK_USER": END_USER if target == "governed" else "",
                "WRK_STREAM": "1" if stream else "0", "WRK_FIXED": "1" if fixed else "0",
                "WRK_RUN": uuid.uuid4().hex[:8]}

    def point(self, url: str, *, variant: str, target: str, stream: bool, connections: int,
              watch: dict[str, list[psutil.Process]], cache: str = "miss",
              gateway_url: str | None = None, duration_s: float | None = None,
              record: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        env = self.wrk_env(target=target, stream=stream, fixed=cache == "hit")
        # Counters are read with nothing in flight: when wrk stops, each connection's
        # last request is still being served (at 256 connections that backlog takes
        # seconds), and its Redis commands and CPU belong to this point, not the next.
        procs.wait_idle(watch)
        canary = procs.canary_ms()
        redis_before = procs.redis_stats(self.redis_port)
        metrics_before = procs.scrape(gateway_url) if gateway_url else {}
        cpu_before = procs.cpu_snapshot(watch)
        wrk = procs.run_wrk(f"{url}/v1/chat/completions", connections=connections,
                            duration_s=duration_s or self.args.duration_s, env=env,
                            out_dir=self.work)
        procs.wait_idle(watch)
        cpu_after = procs.cpu_snapshot(watch)
        metrics_after = procs.scrape(gateway_url) if gateway_url else {}
        redis_after = procs.redis_stats(self.redis_port)
        point = load_report.summarise(
            wrk, variant=variant, stream=stream, connections=connections, cache=cache,
            redis=(redis_before, redis_after), cpu=(cpu_before, cpu_after),
            metrics=(metrics_before, metrics_after))
        point["canary_ms"] = canary
        (self.points if record is None else record).append(point)
        print(load_report.one_line(point), flush=True)
        return point

    def grid(self, url: str, variant: str, target: str, watch: dict[str, list[psutil.Process]],
             gateway_url: str | None) -> None:
        for stream in (False, True):
            for c in self.args.connections:
                self.point(url, variant=variant, target=target, stream=stream, connections=c,
                           watch=watch, gateway_url=gateway_url)

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        self.logs.mkdir()
        started = time.monotonic()
        redis, self.redis_port = procs.start_redis(self.logs)
        upstream, upstream_url = procs.start_upstream(
            self.logs, latency_ms=self.args.latency_ms, api_key=UPSTREAM_KEY)
        proxy = procs.start_proxy(self.logs, target_port=self.redis_port, delay_ms=0)
        parts = [redis, upstream, proxy.proc]
        try:
            self.rtt_ms["direct"] = procs.ping_rtt_ms(self.redis_port)
            base = {"upstream": [psutil.Process(upstream.pid)],
                    "redis": [psutil.Process(redis.pid)]}
            self.grid(upstream_url, "direct", "direct", base, None)
            governed = self.work / "gateway.yaml"
            governed.write_text(yaml.safe_dump(gateway_yaml(self.work / "state", upstream_url)))
            bare = gateway_yaml(self.work / "state", upstream_url)
            bare["litellm_settings"]["cache"] = False
            bare["router_settings"]["routing_strategy"] = "simple-shuffle"
            bare_config = self.work / "gateway-bare.yaml"
            bare_config.write_text(yaml.safe_dump(bare))
            direct_url = f"redis://127.0.0.1:{self.redis_port}"
            with self.gateway("gateway, 1 worker", governed, 1, direct_url, base) as (url, w):
                self.grid(url, "gateway, 1 worker", "governed", w, url)
                if not self.args.no_cache_hits:
                    for c in self.args.connections:
                        self.point(url, variant="gateway, 1 worker", target="governed",
                                   stream=False, connections=c, cache="hit", watch=w,
                                   gateway_url=url)
            label = "gateway, 1 worker, governance off"
            with self.gateway(label, bare_config, 1, direct_url, base) as (url, w):
                self.grid(url, label, "master", w, url)
            if self.args.litellm:
                self.litellm(upstream_url, base)
            if self.args.overload_connections:
                self.overload(upstream_url, direct_url, base)
            if not self.args.no_two_workers:
                with self.gateway("gateway, 2 workers", governed, 2, direct_url,
                                  base) as (url, w):
                    self.grid(url, "gateway, 2 workers", "governed", w, None)
            if not self.args.no_proxy:
                self.behind_proxy(proxy, governed, base)
            if self.args.profile:
                self.profile_run(governed, direct_url)
        finally:
            for part in reversed(parts):
                part.stop()
        return {"settings": self.settings(), "redis_ping_rtt_ms": self.rtt_ms,
                "points": self.points, "redis_delay_sweep": self.sweep,
                "memory": self.memory, "profile": self.profile,
                "elapsed_s": round(time.monotonic() - started, 1)}

    @contextlib.contextmanager
    def gateway(self, variant: str, config: Path, workers: int, redis_url: str,
                base: dict[str, list[psutil.Process]], server: str = "triogate",
                ) -> Iterator[tuple[str, dict[str, list[psutil.Process]]]]:
        """A gateway process (behind ``server``) for the block, provisioned and warmed up;
        its URL and the processes to watch. Records its workers' peak RSS at the end."""
        gateway, url = procs.start_gateway(self.logs, config=config, workers=workers,
                                           redis_url=redis_url, server=server,
                                           name=f"gateway-{len(self.memory)}")
        try:
            if self.key is None:
                self.key = provision(url)
            watch = {**base, "gateway": procs.gateway_workers(gateway, workers)}
            # Warm-up: connections, scripts, identity, allocator; not recorded.
            target = "master" if "governance off" in variant else "governed"
            procs.run_wrk(f"{url}/v1/chat/completions", connections=32,
                          duration_s=self.args.warmup_s,
                          env=self.wrk_env(target=target, stream=False), out_dir=self.work)
            yield url, watch
            self.memory.append({"variant": variant, "workers": workers, "peak_rss_kib": [
                procs.peak_rss_kib(p.pid) for p in watch["gateway"]]})
        finally:
            gateway.stop()

    def litellm(self, upstream_url: str, base: dict[str, list[psutil.Process]]) -> None:
        """The LiteLLM proxy, 1 worker, the same deployments, usage-based routing and
        Redis cache, the master key, non-streaming: the side-by-side column."""
        config = self.work / "litellm.yaml"
        config.write_text(yaml.safe_dump(litellm_yaml(upstream_url, self.redis_port)))
        proc, url = procs.start_litellm(self.logs, litellm=self.args.litellm, config=config)
        variant = "litellm, 1 worker, master key"
        try:
            root = psutil.Process(proc.pid)
            watch = {**base, "gateway": [root, *root.children(recursive=True)]}
            procs.run_wrk(f"{url}/v1/chat/completions", connections=32,
                          duration_s=self.args.warmup_s,
                          env=self.wrk_env(target="master", stream=False), out_dir=self.work)
            for c in self.args.litellm_connections:
                self.point(url, variant=variant, target="master", stream=False,
                           connections=c, watch=watch)
            self.memory.append({"variant": variant, "workers": 1, "peak_rss_kib": [
                sum(procs.peak_rss_kib(p.pid) for p in watch["gateway"])]})
        finally:
            proc.stop()

    def overload(self, upstream_url: str, redis_url: str,
                 base: dict[str, list[psutil.Process]]) -> None:
        """One worker with ``max_in_flight`` set, under far more connections than that
        (non-streaming): the refused requests are wrk's *failed* (503) column."""
        limited = gateway_yaml(self.work / "state", upstream_url)
        limited["triogate"]["max_in_flight"] = self.args.max_in_flight
        config = self.work / "gateway-limited.yaml"
        config.write_text(yaml.safe_dump(limited))
        variant = f"gateway, 1 worker, max_in_flight {self.args.max_in_flight}"
        with self.gateway(variant, config, 1, redis_url, base) as (url, watch):
            self.point(url, variant=variant, target="governed", stream=False,
                       connections=self.args.overload_connections, watch=watch,
                       gateway_url=url)

    def behind_proxy(self, proxy: procs.Proxy, config: Path,
                     base: dict[str, list[psutil.Process]]) -> None:
        """One gateway whose Redis is behind the delay proxy: the grid at +0 ms (the
        proxy's own cost) and at +``--redis-delay-ms``; then, at one connection, the
        delays of ``--sweep-delays-ms`` interleaved over several rounds, whose slope
        (p50 growth per ms of round trip) counts the waits on the latency path."""
        base = {**base, "proxy": [psutil.Process(proxy.proc.pid)]}
        with self.gateway("gateway, 1 worker, Redis via proxy", config, 1,
                          f"redis://127.0.0.1:{proxy.port}", base) as (url, watch):
            for delay in dict.fromkeys((0.0, self.args.redis_delay_ms)):
                proxy.set_delay(delay)
                self.rtt_ms[f"proxy +{delay:g} ms"] = procs.ping_rtt_ms(proxy.port)
                self.grid(url, f"gateway, 1 worker, Redis via proxy +{delay:g} ms",
                          "governed", watch, url)
            for round_ in range(self.args.sweep_rounds):
                for delay in self.args.sweep_delays_ms:
                    proxy.set_delay(delay)
                    rtt = procs.ping_rtt_ms(proxy.port, count=100)
                    for stream in (False, True):
                        point = self.point(
                            url, variant=f"sweep +{delay:g} ms", target="governed",
                            stream=stream, connections=1, watch=watch, gateway_url=url,
                            duration_s=self.args.sweep_s, record=self.sweep)
                        point.update(delay_ms=delay, redis_rtt_ms=round(rtt, 4), round=round_)
            proxy.set_delay(0)

    def profile_run(self, config: Path, redis_url: str) -> None:
        """One worker under py-spy at 32 connections (not timed: py-spy slows it)."""
        raw = self.work / "profile.txt"
        gateway, url = procs.start_gateway(self.logs, config=config, workers=1,
                                           redis_url=redis_url, name="gateway-profiled",
                                           profile_to=raw)
        try:
            (worker,) = procs.gateway_workers(gateway, 1)
            procs.run_wrk(f"{url}/v1/chat/completions", connections=32,
                          duration_s=self.args.duration_s,
                          env=self.wrk_env(target="governed", stream=False), out_dir=self.work)
            # Stop the gateway, not py-spy: py-spy writes its file when its target exits.
            worker.terminate()
            gateway.popen.wait(30)
        finally:
            gateway.stop()
        if raw.exists():
            self.profile = load_report.profile_summary(raw.read_text())
        else:
            print(f"py-spy wrote nothing: {gateway.log_tail()}", file=sys.stderr)

    def settings(self) -> dict[str, Any]:
        return {
            "upstream_latency_ms": self.args.latency_ms,
            "redis_delay_ms": self.args.redis_delay_ms,
            "sweep_delays_ms": self.args.sweep_delays_ms, "sweep_rounds": self.args.sweep_rounds,
            "sweep_s": self.args.sweep_s,
            "duration_s": self.args.duration_s, "warmup_s": self.args.warmup_s,
            "connections": self.args.connections, "quick": self.args.quick,
            "cpus": psutil.cpu_count(), "python": sys.version.split()[0],
            "wrk_threads": "min(2, connections)",
            "redis_server": find_server_binary(),
            "load_average_at_start": self.load_at_start,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 and 32 connections, 2 s per point")
    parser.add_argument("--duration-s", type=int, default=10,
                        help="per point (whole seconds: wrk's unit)")
    parser.add_argument("--warmup-s", type=int, default=3, help="per gateway start")
    parser.add_argument("--latency-ms", type=float, default=20.0,
                        help="the fake upstream's latency per answer")
    parser.add_argument("--redis-delay-ms", type=float, default=1.0,
                        help="Redis round-trip delay of the proxied grid (default 1)")
    parser.add_argument("--sweep-delays-ms", type=float, nargs="+", default=[0.0, 1.0, 20.0],
                        help="delays of the one-connection sweep (default 0 1 20)")
    parser.add_argument("--sweep-rounds", type=int, default=10)
    parser.add_argument("--sweep-s", type=int, default=2, help="per sweep point")
    parser.add_argument("--connections", type=int, nargs="+",
                        help="concurrent connections per point "
                        "(default 1 32 256 1024; quick: 1 32)")
    parser.add_argument("--no-cache-hits", action="store_true")
    parser.add_argument("--overload-connections", type=int, default=4096,
                        help="connections of the overload point (0: skip it)")
    parser.add_argument("--max-in-flight", type=int, default=256,
                        help="the overload point's triogate.max_in_flight")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one worker with py-spy at 32 connections")
    parser.add_argument("--litellm", type=Path, default=None,
                        help="the `litellm` executable of a venv with litellm[proxy]: "
                        "adds LiteLLM's column (non-streaming, master key)")
    parser.add_argument("--litellm-connections", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--no-two-workers", action="store_true",
                        help="skip the 2-worker grid")
    parser.add_argument("--no-proxy", action="store_true",
                        help="skip the Redis-behind-the-delay-proxy grid and sweep")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s, args.warmup_s, args.sweep_s, args.sweep_rounds = 2, 1, 1, 2
    if args.connections is None:
        args.connections = [1, 32] if args.quick else [1, 32, 256, 1024]
    if args.quick:
        args.overload_connections = 0
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install -y wrk", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tg-load-") as folder:
        results = Bench(args, Path(folder)).run()
    paths = load_report.write(results, args.out)
    print(paths["md"].read_text())
    print("written: " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
