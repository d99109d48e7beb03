"""The gateway behind its own HTTP server and behind hypercorn, side by side.

    python bench/servers.py                       # results/servers.{json,md}
    python bench/servers.py -c 32 256 -d 10 --rounds 2

One gateway worker (``triogate serve`` and ``triogate serve --server hypercorn``), the
governed load of ``bench/load.py`` (virtual key, team and end-user budgets, TPM/RPM,
usage-based routing, the response cache, every request a cache miss) from wrk's
keep-alive connections, non-streaming and streaming, against the fake upstream
(``--latency-ms``) and a Redis-compatible server on TCP. The two servers alternate
within each round, so read their ratio within one run: the host's speed drifts between
runs. Per point: requests/s, p50/p99 latency, the gateway's CPU per request.

The HTTP server alone is ``bench/hello_server.py``; the cost of one streamed chunk is
``bench/streams.py --server triogate|hypercorn``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import load as L  # noqa: E402
import load_procs as procs  # noqa: E402

SERVERS = ("triogate", "hypercorn")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-c", "--connections", type=int, nargs="+", default=[32, 256])
    p.add_argument("-d", "--duration-s", type=int, default=5)
    p.add_argument("--warmup-s", type=int, default=2)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-stream", action="store_true", help="non-streaming requests only")
    p.add_argument("--out", type=Path, default=L.OUT)
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tg-servers-"))
    bench = L.Bench(a, work)
    bench.logs.mkdir()
    started = time.monotonic()
    redis, bench.redis_port = procs.start_redis(bench.logs)
    upstream, upstream_url = procs.start_upstream(bench.logs, latency_ms=a.latency_ms,
                                                  api_key=L.UPSTREAM_KEY)
    base = {"upstream": [psutil.Process(upstream.pid)], "redis": [psutil.Process(redis.pid)]}
    config = work / "gateway.yaml"
    config.write_text(yaml.safe_dump(L.gateway_yaml(work / "state", upstream_url)))
    redis_url = f"redis://127.0.0.1:{bench.redis_port}"
    points: list[dict[str, Any]] = []
    try:
        for round_ in range(a.rounds):
            for server in SERVERS if round_ % 2 == 0 else reversed(SERVERS):
                with bench.gateway(server, config, 1, redis_url, base,
                                   server=server) as (url, watch):
                    for stream in (False,) if a.no_stream else (False, True):
                        for c in a.connections:
                            point = bench.point(url, variant=server, target="governed",
                                                stream=stream, connections=c, watch=watch,
                                                gateway_url=url, record=points)
                            point["round"] = round_
    finally:
        upstream.stop()
        redis.stop()
    results = {"settings": {"connections": a.connections, "duration_s": a.duration_s,
                            "latency_ms": a.latency_ms, "rounds": a.rounds,
                            "cpus": psutil.cpu_count()},
               "points": points, "elapsed_s": round(time.monotonic() - started, 1)}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "servers.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    (a.out / "servers.md").write_text(markdown(results))
    print((a.out / "servers.md").read_text())
    shutil.rmtree(work, ignore_errors=True)
    return 0


def markdown(results: dict[str, Any]) -> str:
    """A table per round: each shape, both servers, and hypercorn's ratio to the own one."""
    lines = ["| round | mode | connections | server | req/s | p50 ms | p99 ms | "
             "gateway CPU ms/request | failed |", "|---|---|---|---|---|---|---|---|---|"]
    by_shape: dict[tuple[int, str, int], dict[str, dict[str, Any]]] = {}
    for p in results["points"]:
        by_shape.setdefault((p["round"], p["mode"], p["connections"]), {})[p["variant"]] = p
    ratios = []
    for (round_, mode, c), shape in sorted(by_shape.items()):
        for server in SERVERS:
            p = shape.get(server)
            if p is None:
                continue
            cpu = p.get("cpu_ms_per_request", {}).get("gateway")
            lines.append(f"| {round_} | {mode} | {c} | {server} | {p['rps']:.0f} | "
                         f"{p['latency_ms']['p50']:.1f} | {p['latency_ms']['p99']:.1f} | "
                         f"{cpu if cpu is not None else '-'} | {p['failed']} |")
        own, hyp = shape.get("triogate"), shape.get("hypercorn")
        if own and hyp and own["rps"]:
            ratios.append(f"- round {round_}, {mode}, {c} connections: hypercorn serves "
                          f"{hyp['rps'] / own['rps']:.2f}x the own server's requests/s")
    return "\n".join([*lines, "", *ratios, ""])


if __name__ == "__main__":
    raise SystemExit(main())
