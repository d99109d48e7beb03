"""Where a one-connection request's added latency goes, from system-call timestamps
(issue 13, goal 4).

    python bench/tail_timeline.py TREE[@JSON] [TREE...] -d 6 --trace 3 [--sched] [--keep]

One Redis and one fake upstream (20 ms); a governed gateway (1 worker) per tree, as in
``tail_spans.py``. Per tree: wrk at one connection for ``-d`` s; ``--trace`` s of it are
recorded with ``perf trace`` (the gateway worker, Redis, the upstream and wrk: their
socket reads and writes and epoll waits, with ``--sched`` the scheduler's wake-ups and
switches too). Each request is then cut at its system calls:

* ``in``: wrk's write of the request → the worker's read of it (a wake-up);
* ``pre``: that read → the worker's write of the pre-call pipeline to Redis;
* ``redis``: that write → the worker's read of the reply (Redis's wake-up, its work, the
  worker's wake-up); ``redis_srv``: Redis's read → its write, within it;
* ``route``: the reply → the worker's write to the upstream;
* ``upstream``: that write → the worker's first read of the response;
* ``post``: that read → the worker's write of the response to the client;
* ``out``: that write → wrk's read;
* ``after``: the response's write → the next request's read (work the worker did or
  woke for in between: settle flush, next request's wait);

with the request's wrk-to-wrk total. Medians and p90/p99 of each part, per tree; perf
trace slows every system call a little, so compare trees within one run. ``--keep``
leaves the raw traces in the work folder.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import load as L
import load_procs as procs
import psutil
import tree_gateway
from ab import wrk_env

_LINE = re.compile(
    r"^\s*(?P<t>[\d.]+)\s+\(\s*(?P<dur>[\d.]*)\s*(?:ms)?\s*\):\s+(?P<comm>[^/]+)/(?P<tid>\d+)\s+"
    r"(?P<call>\w+)\((?P<args>.*?)\)\s+=\s+(?P<ret>-?\w+)")
_FD = re.compile(r"fd: (\d+)")
_CONT = re.compile(
    r"^\s*(?P<t>[\d.]+)\s+\(\s*(?P<dur>[\d.]*)\s*(?:ms)?\s*\):\s+(?P<comm>[^/]+)/(?P<tid>\d+)\s+"
    r"\.\.\. \[continued\]: (?P<call>\w+)\(\)\)\s+=\s+(?P<ret>-?\w+)")
_OPEN = re.compile(
    r"^\s*(?P<t>[\d.]+)\s+\(\s*\):\s+(?P<comm>[^/]+)/(?P<tid>\d+)\s+(?P<call>\w+)\((?P<args>.*?)\)"
    r"\s+\.\.\.\s*$")

SYSCALLS = "read,write,sendto,recvfrom,epoll_wait,epoll_pwait,writev,readv,sendmsg,recvmsg"


def parse(path: Path) -> list[dict[str, Any]]:
    """perf trace's lines: time (ms), duration, comm, tid, call, fd, return value."""
    events = []
    pending: dict[int, int] = {}  # tid -> fd of a call perf printed in two lines
    for line in path.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if not m:
            o = _OPEN.match(line)
            if o:
                fd = _FD.search(o["args"])
                pending[int(o["tid"])] = int(fd[1]) if fd else -1
                continue
            m = _CONT.match(line)
            if not m:
                continue
            try:
                ret = int(m["ret"])
            except ValueError:
                ret = -1
            tid = int(m["tid"])
            events.append({"t": float(m["t"]), "dur": float(m["dur"] or 0), "tid": tid,
                           "comm": m["comm"].strip(), "call": m["call"],
                           "fd": pending.pop(tid, -1), "ret": ret})
            continue
        fd = _FD.search(m["args"])
        try:
            ret = int(m["ret"])
        except ValueError:
            ret = -1
        events.append({"t": float(m["t"]), "dur": float(m["dur"] or 0), "tid": int(m["tid"]),
                       "comm": m["comm"].strip(), "call": m["call"],
                       "fd": int(fd[1]) if fd else -1, "ret": ret})
    events.sort(key=lambda e: e["t"])
    return events


def socket_fds(pid: int) -> dict[int, tuple[int, int]]:
    """fd → (local port, remote port) of a process's TCP sockets."""
    out: dict[int, tuple[int, int]] = {}
    for c in psutil.Process(pid).net_connections(kind="tcp"):
        if c.raddr:
            out[c.fd] = (c.laddr.port, c.raddr.port)
    return out


def cut(events: list[dict[str, Any]], *, worker: int, redis: int, wrk_tids: set[int],
        fds: dict[int, tuple[int, int]], gw_port: int, redis_port: int,
        up_port: int) -> list[dict[str, float]]:
    """Per request, the parts named in the module docstring (ms)."""
    kind = {}
    for fd, (_, rport) in fds.items():
        kind[fd] = ("redis" if rport == redis_port else "up" if rport == up_port
                    else "client")
    reads = ("read", "recvfrom", "readv", "recvmsg")
    writes = ("write", "sendto", "writev", "sendmsg")
    rows: list[dict[str, float]] = []
    cur: dict[str, float] = {}
    last_wrk_write = None
    last_out = None
    redis_read = None
    for e in events:
        end = e["t"] + e["dur"]
        if e["tid"] in wrk_tids:
            if e["call"] in writes and e["ret"] > 0:
                last_wrk_write = e["t"]
            elif e["call"] in reads and e["ret"] > 0 and "wrote" in cur:
                cur["wrk_read"] = e["t"]
                rows.append(cur)
                cur = {}
            continue
        if e["tid"] == redis:
            if e["call"] in reads and e["ret"] > 0:
                redis_read = e["t"]
            elif e["call"] in writes and e["ret"] > 0 and redis_read is not None:
                key = "redis_srv" if "redis_w" not in cur else "redis_srv2"
                if "pre_w" in cur and "pre_r" not in cur:
                    cur.setdefault(key, e["t"] - redis_read)
                redis_read = None
            continue
        if e["tid"] != worker or e["ret"] <= 0:
            continue
        k = kind.get(e["fd"])
        if k == "client" and e["call"] in reads and "start" not in cur:
            cur["start"] = e["t"]
            cur["wrk_write"] = last_wrk_write if last_wrk_write is not None else e["t"]
            if last_out is not None:
                cur["after"] = e["t"] - last_out
        elif k == "redis" and e["call"] in writes and "start" in cur and "pre_w" not in cur:
            cur["pre_w"] = e["t"]
        elif k == "redis" and e["call"] in reads and "pre_w" in cur and "pre_r" not in cur:
            cur["pre_r"] = e["t"]
        elif k == "up" and e["call"] in writes and "pre_r" in cur and "up_w" not in cur:
            cur["up_w"] = e["t"]
        elif k == "up" and e["call"] in reads and "up_w" in cur and "up_r" not in cur:
            cur["up_r"] = e["t"]
        elif k == "client" and e["call"] in writes and "up_r" in cur and "wrote" not in cur:
            cur["wrote"] = end
            last_out = end
        del end
    sleeps = [(e["t"], e["t"] + e["dur"]) for e in events
              if e["tid"] == worker and e["call"] in ("epoll_wait", "epoll_pwait")
              and e["dur"] > 0.02]

    def slept(a: float, b: float) -> float:
        return sum(max(0.0, min(b, y) - max(a, x)) for x, y in sleeps if y > a and x < b)

    parts = []
    for r in rows:
        if not all(k in r for k in ("start", "pre_w", "pre_r", "up_w", "up_r", "wrote")):
            continue
        parts.append({
            "in": r["start"] - r["wrk_write"],
            "pre": r["pre_w"] - r["start"],
            "redis": r["pre_r"] - r["pre_w"],
            "redis_srv": r.get("redis_srv", float("nan")),
            "route": r["up_w"] - r["pre_r"],
            "upstream": r["up_r"] - r["up_w"],
            "post": r["wrote"] - r["up_r"],
            "out": r["wrk_read"] - r["wrote"],
            "after": r.get("after", float("nan")),
            "total": r["wrk_read"] - r["wrk_write"],
            "gw": r["wrote"] - r["start"] - (r["up_r"] - r["up_w"]),
            "pre_run": r["pre_w"] - r["start"] - slept(r["start"], r["pre_w"]),
            "redis_sleep": slept(r["pre_w"], r["pre_r"]),
            "route_run": r["up_w"] - r["pre_r"] - slept(r["pre_r"], r["up_w"]),
            "post_run": r["wrote"] - r["up_r"] - slept(r["up_r"], r["wrote"]),
            "up_run": r["up_r"] - r["up_w"] - slept(r["up_w"], r["up_r"]),
        })
    return parts


def summary(parts: list[dict[str, float]]) -> dict[str, tuple[float, float, float, float]]:
    out = {}
    for k in parts[0] if parts else ():
        xs = sorted(p[k] for p in parts if p[k] == p[k])
        if not xs:
            continue
        q = statistics.quantiles(xs, n=100) if len(xs) > 2 else xs * 99
        out[k] = (round(statistics.fmean(xs), 3), round(q[49], 3), round(q[89], 3),
                  round(q[98], 3))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="+")
    p.add_argument("-d", type=int, default=6)
    p.add_argument("--trace", type=float, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--sched", action="store_true")
    p.add_argument("--keep", action="store_true")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="timeline-"))
    logs = work / "logs"
    logs.mkdir()
    redis, rport = procs.start_redis(logs)
    up, upurl = procs.start_upstream(logs, latency_ms=20, api_key=L.UPSTREAM_KEY)
    up_port = int(upurl.rsplit(":", 1)[1].split("/")[0])
    gws = []
    results: dict[int, list[dict[str, float]]] = {}
    try:
        for i, spec in enumerate(a.trees):
            tree, _, own = spec.partition("@")
            g, url, key = tree_gateway.start(i, tree, work=work, logs=logs, upstream_url=upurl,
                                             redis_port=rport,
                                             settings=json.loads(own) if own else None)
            gws.append((g, url, key))
            print(f"tree={i} {spec}", flush=True)
        for _, url, key in gws:
            procs.run_wrk(f"{url}/v1/chat/completions", connections=8, duration_s=2,
                          env=wrk_env(key, "governed", False), out_dir=work)
        for r in range(a.rounds):
            for i, (g, url, key) in enumerate(gws):
                worker = procs.gateway_workers(g, 1)[0].pid
                gw_port = int(url.rsplit(":", 1)[1])
                out = work / f"trace-{r}-{i}.txt"
                wrk = subprocess.Popen(
                    ["wrk", "-t", "1", "-c", "1", "-d", f"{a.d}s", "--timeout", "30s", "-s",
                     str(procs.WRK_SCRIPT), f"{url}/v1/chat/completions"],
                    env={**__import__("os").environ, **wrk_env(key, "governed", False),
                         "WRK_OUT": str(work / f"wrk-{r}-{i}.json")},
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.5)
                fds = socket_fds(worker)
                pids = [worker, redis.pid, up.pid, wrk.pid]
                events = f"{SYSCALLS}" + (",sched:sched_wakeup,sched:sched_switch"
                                         if a.sched else "")
                tracer = subprocess.Popen(
                    ["perf", "trace", "-o", str(out), "-e", events,
                     "-p", ",".join(map(str, pids))],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(a.trace)
                tracer.send_signal(signal.SIGINT)
                tracer.wait()
                wrk.wait()
                fds.update(socket_fds(worker))
                wrk_tids = {t.id for t in psutil.Process(wrk.pid).threads()} if \
                    wrk.poll() is None else set()
                evs = parse(out)
                if not wrk_tids:
                    wrk_tids = {e["tid"] for e in evs if e["comm"].startswith("wrk")}
                parts = cut(evs, worker=worker, redis=redis.pid, wrk_tids=wrk_tids, fds=fds,
                            gw_port=gw_port, redis_port=rport, up_port=up_port)
                results.setdefault(i, []).extend(parts)
                s = summary(parts)
                print(f"r{r} tree={i} requests={len(parts)} (mean, p50, p90, p99 ms)",
                      flush=True)
                for k, v in s.items():
                    print(f"    {k:10s} {v}", flush=True)
                if not a.keep:
                    out.unlink()
        if a.rounds > 1:
            for i, parts in results.items():
                print(f"all rounds tree={i} requests={len(parts)}")
                for k, v in summary(parts).items():
                    print(f"    {k:10s} {v}")
    finally:
        for g, *_ in gws:
            g.stop()
        up.stop()
        redis.stop()
    print(f"work: {work}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
