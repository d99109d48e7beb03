"""A/B: gateways built from several source trees, side by side on one Redis and one fake
upstream, their points alternating, so that a noisy host affects them alike.

    python bench/ab.py /tmp/base-tree "$PWD" -c 1 32 256 1024 -d 5 --rounds 2

Each tree runs as ``PYTHONPATH=<tree> python -m triogate serve`` (1 worker, governed: key,
team and end-user budgets, RPM/TPM). Per point: req/s, p50/p99, the gateway's and Redis's
CPU per request, and the server's microseconds in scripts per request (INFO
commandstats). ``--profile I:C[,I:C...]`` records tree I at C connections with py-spy
(``/tmp/prof-I-C.txt``). ``AB_VERBOSE=1`` adds per-command calls and µs per request.
A tree given as ``TREE@JSON`` gets JSON merged into its own ``triogate:`` settings, e.g.
``"$PWD" "$PWD@{\"redis\": {\"pool_size\": 256}}"`` compares one setting in one tree.
The gateways' log lines are counted per message at the end (timeouts, journaling).
``--paired`` loads every tree at the same time (one wrk each): on a shared host whose
load moves from minute to minute, that weighs on all trees alike, where alternating
points only spread it out. ``--pin-redis`` gives Redis (all its threads) the last CPU to
itself and everything else the others, as a Redis on its own machine would be: what the
server costs per request when it does not share its core with the gateway.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import load as L
import load_procs as procs
import psutil
import yaml


def redis_usec(port: int) -> dict[str, tuple[int, int]]:
    """``{command: (calls, usec)}`` from INFO commandstats."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        text = procs._resp(sock, b"INFO commandstats\r\n").decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("cmdstat_"):
            name, _, value = line.partition(":")
            fields = dict(kv.split("=") for kv in value.split(","))
            out[name[8:]] = (int(fields["calls"]), int(fields["usec"]))
    return out


def wrk_env(key: str, target: str, stream: bool) -> dict[str, str]:
    auth = {"governed": key, "master": L.MASTER_KEY}[target]
    return {"WRK_AUTH": f"Bearer {auth}", "WRK_MODEL": L.GROUP,
            "WRK_USER": L.END_USER if target == "governed" else "",
            "WRK_STREAM": "1" if stream else "0", "WRK_FIXED": "0",
            "WRK_RUN": uuid.uuid4().hex[:8]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="+")
    p.add_argument("-c", type=int, nargs="+", default=[32, 256])
    p.add_argument("-d", type=int, default=5, help="seconds per point")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--target", default="governed", choices=["governed", "master"])
    p.add_argument("--stream", action="store_true")
    p.add_argument("--latency-ms", type=float, default=20)
    p.add_argument("--profile", default="", help="TREE_INDEX:CONNECTIONS[,...]")
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples a second")
    p.add_argument("--paired", action="store_true",
                   help="load every tree at once (one wrk each), so that the host's load "
                   "at that moment weighs on all alike; CPU per request is each gateway's")
    p.add_argument("--extra", default="", help="JSON merged into triogate: (not for a "
                   "tree whose path contains 'base', which may not know the settings)")
    p.add_argument("--pin-redis", action="store_true",
                   help="Redis alone on the last CPU, the rest on the others")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ab-"))
    logs = work / "logs"
    logs.mkdir()
    cpus = sorted(os.sched_getaffinity(0))
    if a.pin_redis:
        if len(cpus) < 2:
            raise SystemExit("--pin-redis needs two CPUs")
        os.sched_setaffinity(0, cpus[:-1])  # inherited by every process started below
    redis, rport = procs.start_redis(logs)
    if a.pin_redis:
        subprocess.run(["taskset", "-a", "-cp", str(cpus[-1]), str(redis.pid)], check=True,
                       capture_output=True)
    up, upurl = procs.start_upstream(logs, latency_ms=a.latency_ms, api_key=L.UPSTREAM_KEY)
    gws = []
    try:
        # ``python -m`` puts the working directory first on sys.path: run from inside a
        # source tree, every gateway would import THAT tree, whatever PYTHONPATH says.
        os.environ["PYTHONSAFEPATH"] = "1"
        for i, spec in enumerate(a.trees):
            # TREE@JSON: this tree's gateway gets JSON merged into its triogate: settings
            # (one level deep), e.g. the same tree twice with two pool sizes.
            tree, _, own = spec.partition("@")
            os.environ["PYTHONPATH"] = tree
            imported = subprocess.run(
                [sys.executable, "-c", "import triogate; print(triogate.__file__)"],
                capture_output=True, text=True, check=True).stdout.strip()
            if not Path(imported).resolve().is_relative_to(Path(tree).resolve()):
                raise SystemExit(f"tree {i} would import {imported}, not {tree}")
            print(f"tree={i} {spec}", flush=True)
            cfg = L.gateway_yaml(work / f"state{i}", upurl)
            if "base" in tree:
                cfg["triogate"].pop("max_in_flight", None)
            if a.target == "master":
                cfg["litellm_settings"]["cache"] = False
                cfg["router_settings"]["routing_strategy"] = "simple-shuffle"
            if a.extra and "base" not in tree:
                cfg["triogate"].update(json.loads(a.extra))
            for k, v in (json.loads(own) if own else {}).items():
                merged = cfg["triogate"].get(k)
                cfg["triogate"][k] = {**merged, **v} if isinstance(merged, dict) else v
            path = work / f"gw{i}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            g, url = procs.start_gateway(logs, config=path, workers=1,
                                         redis_url=f"redis://127.0.0.1:{rport}", name=f"gw{i}")
            gws.append((g, url, L.provision(url), procs.gateway_workers(g, 1)))
        for _, url, key, _ in gws:
            procs.run_wrk(f"{url}/v1/chat/completions", connections=32, duration_s=2,
                          env=wrk_env(key, a.target, a.stream), out_dir=work)
        for r in range(a.rounds):
            for c in a.c:
                if a.paired:
                    paired_point(a, r, c, gws, redis, work)
                    continue
                for i, (_, url, key, w) in enumerate(gws):
                    point(a, r, c, i, url, key, w, redis, rport, work)
    finally:
        for g, *_ in gws:
            g.stop()
        up.stop()
        redis.stop()
        for i in range(len(gws)):
            log_summary(i, logs / f"gw{i}.log")


def log_summary(i: int, log: Path) -> None:
    """The gateway's warnings and errors by message (ids and paths blanked): a point's
    CPU per request means little if its Redis calls timed out and decisions degraded."""
    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            message = str(json.loads(line)["message"])
        except (ValueError, KeyError, TypeError):
            continue
        message = re.sub(r"[0-9a-f]{16,}|\(see [^)]*\)|/\S+", "…", message)[:120]
        counts[message] = counts.get(message, 0) + 1
    for message, n in sorted(counts.items(), key=lambda kv: -kv[1])[:6]:
        print(f"tree={i} log x{n}: {message}")


def paired_point(a: argparse.Namespace, r: int, c: int,
                 gws: list[tuple[procs.Proc, str, str, list[psutil.Process]]],
                 redis: procs.Proc, work: Path) -> None:
    """Every tree under load at the same time (one wrk each, ``c`` connections each)."""
    watch = {"redis": [psutil.Process(redis.pid)], **{f"gw{i}": w for i, (*_, w) in
                                                       enumerate(gws)}}
    procs.wait_idle(watch)
    c0 = procs.cpu_snapshot(watch)
    with ThreadPoolExecutor(len(gws)) as pool:
        runs = [pool.submit(procs.run_wrk, f"{url}/v1/chat/completions", connections=c,
                            duration_s=a.d, env=wrk_env(key, a.target, a.stream),
                            out_dir=work) for _, url, key, _ in gws]
        results = [run.result() for run in runs]
    procs.wait_idle(watch)
    c1 = procs.cpu_snapshot(watch)
    for i, res in enumerate(results):
        n = res["requests"] + c
        gw_ms = (c1[f"gw{i}"] - c0[f"gw{i}"]) * 1000 / n
        lat = res["latency_us"]
        rps = res["requests"] / res["duration_us"] * 1e6
        print(f"r{r} c={c:5d} tree={i} paired rps={rps:7.1f} p50={lat['p50'] / 1000:7.1f} "
              f"p99={lat['p99'] / 1000:8.1f} failed={sum(res['errors'].values())} "
              f"gw_cpu={gw_ms:.3f}ms", flush=True)


def point(a: argparse.Namespace, r: int, c: int, i: int, url: str, key: str,
          w: list[psutil.Process], redis: procs.Proc, rport: int, work: Path) -> None:
    watch = {"redis": [psutil.Process(redis.pid)], "gw": w}
    procs.wait_idle(watch)
    u0, c0 = redis_usec(rport), procs.cpu_snapshot(watch)
    spy = None
    if f"{i}:{c}" in a.profile.split(","):
        spy = subprocess.Popen(
            ["py-spy", "record", "--format", "raw", "--rate", str(a.profile_rate), "--gil",
             "-d", str(a.d),
             "-o", f"/tmp/prof-{i}-{c}.txt", "-p", str(w[0].pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    res = procs.run_wrk(f"{url}/v1/chat/completions", connections=c, duration_s=a.d,
                        env=wrk_env(key, a.target, a.stream), out_dir=work)
    procs.wait_idle(watch)
    if spy:
        spy.wait(60)
    c1, u1 = procs.cpu_snapshot(watch), redis_usec(rport)
    n = res["requests"] + c
    gw_ms = (c1["gw"] - c0["gw"]) * 1000 / n
    redis_ms = (c1["redis"] - c0["redis"]) * 1000 / n
    top = {k: (v[0] - u0.get(k, (0, 0))[0], v[1] - u0.get(k, (0, 0))[1])
           for k, v in u1.items() if v != u0.get(k)}
    scripts = sum(top.get(k, (0, 0))[1] for k in ("evalsha", "eval"))
    lat = res["latency_us"]
    rps = res["requests"] / res["duration_us"] * 1e6
    print(f"r{r} c={c:5d} tree={i} rps={rps:7.1f} p50={lat['p50'] / 1000:7.1f} "
          f"p99={lat['p99'] / 1000:8.1f} failed={sum(res['errors'].values())} "
          f"gw_cpu={gw_ms:.3f}ms redis_cpu={redis_ms:.3f}ms script_usec/req={scripts / n:.1f} "
          f"evalsha/req={top.get('evalsha', (0, 0))[0] / n:.2f}", flush=True)
    if os.environ.get("AB_VERBOSE"):
        print("   ", {k: (round(v[0] / n, 2), round(v[1] / n, 1)) for k, v in top.items()})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
