"""The one-connection tail, tree against tree (issue 13, goal 4).

    python bench/tail_spans.py /tmp/base-tree "$PWD" --rounds 5 -d 8 [--c32]

One Redis and one fake upstream (20 ms); a governed gateway (1 worker) per source tree,
each with ``bench/spanprobe`` on its PYTHONPATH. Per round, in turn: the upstream
direct, then each tree, at one connection (cache misses, governed key, end user). Per
point: wrk's p50/p99 and the added p50/p99 (minus this round's direct point), the
gateway's CPU per request, and what the probe saw in the worker meanwhile: collector
passes and their durations, settler flushes that started while a request was still in
its pre-call work, how long after the last response flushes start, worker-thread jobs.
At the end: medians over rounds per tree. ``--c32`` adds a 32-connection point per tree
(CPU per request). A tree given as ``TREE@JSON`` gets JSON merged into its settings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import load as L
import load_procs as procs
import psutil
import yaml
from ab import wrk_env

BENCH = Path(__file__).resolve().parent


def probe_lines(log: Path, mark: int) -> tuple[dict[str, Any] | None, int]:
    lines = log.read_text(errors="replace").splitlines()
    last = None
    for line in lines:
        if line.startswith("spanprobe "):
            last = json.loads(line[len("spanprobe "):])
    return last, len(lines) if mark >= 0 else mark


def latest_probe(log: Path) -> dict[str, Any]:
    last, _ = probe_lines(log, 0)
    return last or {}


def delta(a: Any, b: Any) -> Any:
    """b - a, recursively (numbers, lists, dicts)."""
    if isinstance(b, dict):
        return {k: delta(a.get(k, 0) if isinstance(a, dict) else 0, v) for k, v in b.items()}
    if isinstance(b, list):
        a = a if isinstance(a, list) else [0] * len(b)
        return [delta(x, y) for x, y in zip(a, b, strict=True)]
    return round(b - (a or 0), 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="+")
    p.add_argument("-d", type=int, default=8, help="seconds per point")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--c32", action="store_true")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tail-spans-"))
    logs = work / "logs"
    logs.mkdir()
    redis, rport = procs.start_redis(logs)
    up, upurl = procs.start_upstream(logs, latency_ms=20, api_key=L.UPSTREAM_KEY)
    gws: list[tuple[procs.Proc, str, str, list[psutil.Process], Path]] = []
    rows: list[dict[str, Any]] = []
    try:
        os.environ["PYTHONSAFEPATH"] = "1"
        os.environ["SPANPROBE"] = "1"
        for i, spec in enumerate(a.trees):
            tree, _, own = spec.partition("@")
            os.environ["PYTHONPATH"] = os.pathsep.join([str(BENCH / "spanprobe"), tree])
            imported = subprocess.run(
                [sys.executable, "-c", "import triogate; print(triogate.__file__)"],
                capture_output=True, text=True, check=True).stdout.strip()
            if not Path(imported).resolve().is_relative_to(Path(tree).resolve()):
                raise SystemExit(f"tree {i} would import {imported}, not {tree}")
            cfg = L.gateway_yaml(work / f"state{i}", upurl)
            if "base" in tree:
                cfg["triogate"].pop("max_in_flight", None)
            cfg["triogate"].update(json.loads(own) if own else {})
            path = work / f"gw{i}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            g, url = procs.start_gateway(logs, config=path, workers=1,
                                         redis_url=f"redis://127.0.0.1:{rport}", name=f"gw{i}")
            gws.append((g, url, L.provision(url), procs.gateway_workers(g, 1), logs / f"gw{i}.log"))
            print(f"tree={i} {spec}", flush=True)
        for _, url, key, _, _ in gws:
            procs.run_wrk(f"{url}/v1/chat/completions", connections=8, duration_s=3,
                          env=wrk_env(key, "governed", False), out_dir=work)
        base = {"upstream": [psutil.Process(up.pid)], "redis": [psutil.Process(redis.pid)]}
        for r in range(a.rounds):
            procs.wait_idle(base)
            res = procs.run_wrk(f"{upurl}/v1/chat/completions", connections=1,
                                duration_s=a.d, env=wrk_env("x", "master", False) | {
                                    "WRK_AUTH": f"Bearer {L.UPSTREAM_KEY}"}, out_dir=work)
            direct = {k: v / 1000 for k, v in res["latency_us"].items()}
            print(f"r{r} direct p50={direct['p50']:.2f} p99={direct['p99']:.2f}", flush=True)
            for i, (_, url, key, w, log) in enumerate(gws):
                for c in ((1, 32) if a.c32 else (1,)):
                    watch = {**base, "gw": w}
                    procs.wait_idle(watch)
                    p0, c0 = latest_probe(log), procs.cpu_snapshot(watch)
                    res = procs.run_wrk(f"{url}/v1/chat/completions", connections=c,
                                        duration_s=a.d, env=wrk_env(key, "governed", False),
                                        out_dir=work)
                    procs.wait_idle(watch)
                    import time
                    time.sleep(5.5)  # the probe's next line covers the whole point
                    c1, p1 = procs.cpu_snapshot(watch), latest_probe(log)
                    n = res["requests"] + c
                    lat = {k: v / 1000 for k, v in res["latency_us"].items()}
                    row = {"round": r, "tree": i, "c": c,
                           "p50": lat["p50"], "p99": lat["p99"],
                           "added_p50": lat["p50"] - direct["p50"],
                           "added_p99": lat["p99"] - direct["p99"],
                           "gw_cpu_ms": (c1["gw"] - c0["gw"]) * 1000 / n,
                           "redis_cpu_ms": (c1["redis"] - c0["redis"]) * 1000 / n,
                           "failed": sum(res["errors"].values()),
                           "probe": delta(p0, p1)}
                    rows.append(row)
                    pr = row["probe"]
                    print(f"r{r} tree={i} c={c} p50={lat['p50']:.2f} p99={lat['p99']:.2f} "
                          f"added p50={row['added_p50']:+.2f} p99={row['added_p99']:+.2f} "
                          f"gw_cpu={row['gw_cpu_ms']:.2f}ms redis_cpu={row['redis_cpu_ms']:.2f}ms "
                          f"failed={row['failed']}", flush=True)
                    if pr:
                        print(f"    gc={pr['gc']} flush={pr['flush']} thread={pr['thread']} "
                              f"requests={pr['requests']}", flush=True)
                        print(f"    latency by overlap {pr.get('latency')}", flush=True)
                        if pr.get("cycles"):
                            top = sorted(pr["cycles"].items(), key=lambda kv: -kv[1])[:12]
                            print(f"    objects in cycles {top}", flush=True)
                        if pr.get("young"):
                            top = sorted(pr["young"].items(), key=lambda kv: -kv[1])[:12]
                            print(f"    objects a collection walked {top}", flush=True)
    finally:
        for g, *_ in gws:
            g.stop()
        up.stop()
        redis.stop()
    print("medians over rounds (ms):")
    for i in range(len(gws)):
        for c in ((1, 32) if a.c32 else (1,)):
            mine = [row for row in rows if row["tree"] == i and row["c"] == c]
            if not mine:
                continue
            med = {k: round(statistics.median(row[k] for row in mine), 2)
                   for k in ("p50", "p99", "added_p50", "added_p99", "gw_cpu_ms",
                             "redis_cpu_ms")}
            print(f"tree={i} c={c} {med}")
    (work / "rows.json").write_text(json.dumps(rows, indent=1))
    print(f"rows: {work / 'rows.json'}")


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
