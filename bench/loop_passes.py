"""Trio's loop passes per governed request, and what each one ran (issue 13, goal 4).

    python bench/loop_passes.py TREE[@JSON] [TREE...] -c 1 32 -d 6 [--sites] [--strace]

Each tree's gateway runs (1 worker, governed as in ``tail_spans.py``) under a trio
Instrument that counts, exactly and whatever the host's load: run-loop passes
(``before_io_wait``), those that could not sleep (timeout 0: a task was runnable, so the
pass was a schedule point's cost alone), task steps, and the worker's voluntary context
switches (``/proc``: the loop's sleeps). With ``--sites`` it also names, per request,
the triogate line each stepped task had suspended at, and (``RUNQ``) the line of each
task still runnable when a pass began: what made the passes that did not sleep. With
``--strace`` a second point per tree counts system calls per request (``strace -c -f``;
strace slows the worker, so that point's pass counts are not comparable). A tree given
as ``TREE@JSON`` gets JSON merged into its ``triogate`` settings.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import load as L
import load_procs as procs
import tree_gateway
from ab import wrk_env
from task_steps import settled

# Runs in the gateway process: trio.run gets the counting instrument, then the CLI runs.
_LAUNCHER = """
import json, os, sys, time, trio
from trio._core._run import GLOBAL_RUN_CONTEXT
out = os.environ["LOOP_PASSES_OUT"]
def site(task):
    coro, last, depth = task.coro, None, 0
    while coro is not None and depth < 80:
        depth += 1
        frame = (getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                 or getattr(coro, "ag_frame", None))
        if frame is not None and "triogate" in frame.f_code.co_filename:
            path = frame.f_code.co_filename.split("triogate/", 1)[-1]
            last = f"{path}:{frame.f_lineno}:{frame.f_code.co_name}"
        coro = (getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
                or getattr(coro, "ag_await", None))
    return last or task.name
class Count(trio.abc.Instrument):
    def __init__(self):
        self.passes = self.zero = self.steps = 0
        self.sites = {}
        self.next_write = 0.0
    def after_task_step(self, task):
        self.steps += 1
        key = site(task)
        self.sites[key] = self.sites.get(key, 0) + 1
    def before_io_wait(self, timeout):
        self.passes += 1
        if timeout <= 0:
            self.zero += 1
            for task in GLOBAL_RUN_CONTEXT.runner.runq:
                key = "RUNQ " + site(task)
                self.sites[key] = self.sites.get(key, 0) + 1
        now = time.monotonic()
        if now >= self.next_write:
            self.next_write = now + 0.5
            with open("/proc/self/status") as f:
                switches = [int(line.split()[1]) for line in f if "ctxt_switches" in line]
            with open(out + ".tmp", "w") as f:
                json.dump({"passes": self.passes, "zero": self.zero, "steps": self.steps,
                           "sites": self.sites, "switches": switches}, f)
            os.replace(out + ".tmp", out)
real_run = trio.run
def run(*args, **kwargs):
    kwargs.setdefault("instruments", []).append(Count())
    return real_run(*args, **kwargs)
trio.run = run
sys.argv = ["triogate", *sys.argv[1:]]
from triogate.cli import main
sys.exit(main())
"""


def strace_point(url: str, key: str, pid: int, c: int, d: int, work: Path) -> str:
    """System calls per request at ``c`` connections, by name (top 12)."""
    out = work / f"strace-{pid}-{c}.txt"
    tracer = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(pid)],
                              stderr=subprocess.DEVNULL)
    time.sleep(1)
    res = procs.run_wrk(f"{url}/v1/chat/completions", connections=c, duration_s=d,
                        env=wrk_env(key, "governed", False), out_dir=work)
    tracer.send_signal(signal.SIGINT)
    tracer.wait()
    n = res["requests"] + c
    calls = {}
    for line in out.read_text().splitlines():
        match = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if match and match.group(2) != "total":
            calls[match.group(2)] = int(match.group(1))
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:12]
    return (f"syscalls/req={sum(calls.values()) / n:.2f} "
            + " ".join(f"{name}={count / n:.2f}" for name, count in top))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="+")
    p.add_argument("-c", type=int, nargs="+", default=[1, 32])
    p.add_argument("-d", type=int, default=6, help="seconds per point")
    p.add_argument("--sites", action="store_true")
    p.add_argument("--strace", action="store_true")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="passes-"))
    logs = work / "logs"
    logs.mkdir()
    redis, rport = procs.start_redis(logs)
    up, upurl = procs.start_upstream(logs, latency_ms=20, api_key=L.UPSTREAM_KEY)
    gws = []
    try:
        for i, spec in enumerate(a.trees):
            tree, _, own = spec.partition("@")
            out = work / f"counts{i}.json"
            g, url, key = tree_gateway.start(
                i, tree, work=work, logs=logs, upstream_url=upurl, redis_port=rport,
                settings=json.loads(own) if own else None, env={"LOOP_PASSES_OUT": str(out)},
                command=[sys.executable, "-c", _LAUNCHER])
            gws.append((spec, g, url, key, out))
            print(f"tree={i} {spec}", flush=True)
        for _, _, url, key, _ in gws:
            procs.run_wrk(f"{url}/v1/chat/completions", connections=8, duration_s=2,
                          env=wrk_env(key, "governed", False), out_dir=work)
        for c in a.c:
            for i, (_, g, url, key, out) in enumerate(gws):
                before = settled(out)
                res = procs.run_wrk(f"{url}/v1/chat/completions", connections=c,
                                    duration_s=a.d, env=wrk_env(key, "governed", False),
                                    out_dir=work)
                after = settled(out)
                n = res["requests"] + c
                per = {k: (after[k] - before[k]) / n for k in ("passes", "zero", "steps")}
                sleeps = [(x - y) / n for x, y in zip(after["switches"], before["switches"],
                                                      strict=True)]
                print(f"c={c} tree={i} requests={n} passes/req={per['passes']:.2f} "
                      f"not_sleeping={per['zero']:.2f} steps/req={per['steps']:.2f} "
                      f"voluntary_cs/req={sleeps[0]:.2f} involuntary_cs/req={sleeps[1]:.2f}",
                      flush=True)
                if a.sites:
                    sites = {k: (v - before["sites"].get(k, 0)) / n
                             for k, v in after["sites"].items()}
                    for name, count in sorted(sites.items(), key=lambda kv: -kv[1])[:16]:
                        if count >= 0.02:
                            print(f"    {count:6.2f} {name}")
                if a.strace:
                    worker = procs.gateway_workers(g, 1)[0].pid
                    print(f"c={c} tree={i} strace: "
                          f"{strace_point(url, key, worker, c, a.d, work)}", flush=True)
    finally:
        for _, g, *_ in gws:
            g.stop()
        up.stop()
        redis.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
