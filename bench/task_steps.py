"""Trio's work per governed request: task steps, tasks spawned, run-loop passes.

    python bench/task_steps.py TREE [TREE...] -c 32 256 -d 4

Each tree's gateway runs (1 worker, governed as in ``ab.py``) under a trio Instrument that
counts ``before_task_step`` (a task resumed: a scheduler hand-off), ``task_spawned`` and
``before_io_wait`` (one run-loop pass) and writes the totals to a file twice a second. Per
point: the counts' growth divided by the requests wrk completed. Unlike CPU time these
are exact and do not depend on the host's load, so they show what a change to the
request path's task structure bought even on a noisy host.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import load as L
import load_procs as procs
import tree_gateway
from ab import wrk_env

# Runs in the gateway process: trio.run gets the counting instrument, then the CLI runs.
_LAUNCHER = """
import json, os, sys, time, trio
out = os.environ["TASK_STEPS_OUT"]
class Count(trio.abc.Instrument):
    def __init__(self):
        self.steps = self.spawned = self.passes = 0
        self.names = {}
        self.next_write = 0.0
    def before_task_step(self, task):
        self.steps += 1
        self.names[task.name] = self.names.get(task.name, 0) + 1
    def task_spawned(self, task):
        self.spawned += 1
    def before_io_wait(self, timeout):
        self.passes += 1
        now = time.monotonic()
        if now >= self.next_write:
            self.next_write = now + 0.5
            with open(out + ".tmp", "w") as f:
                json.dump({"steps": self.steps, "spawned": self.spawned,
                           "passes": self.passes, "names": self.names}, f)
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


def read(path: Path) -> dict[str, Any]:
    """The counts the gateway last wrote (it replaces the file whole; retried while absent)."""
    while True:
        try:
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            time.sleep(0.1)


def settled(path: Path) -> dict[str, Any]:
    """The counts once the gateway is idle (two writes in a row alike)."""
    last = read(path)
    while True:
        time.sleep(1.1)
        now = read(path)
        if now["steps"] - last["steps"] < 50:
            return now
        last = now


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="+")
    p.add_argument("-c", type=int, nargs="+", default=[32, 256])
    p.add_argument("-d", type=int, default=4, help="seconds per point")
    p.add_argument("--latency-ms", type=float, default=20)
    p.add_argument("--names", action="store_true", help="steps per task name, top 12")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="steps-"))
    logs = work / "logs"
    logs.mkdir()
    redis, rport = procs.start_redis(logs)
    up, upurl = procs.start_upstream(logs, latency_ms=a.latency_ms, api_key=L.UPSTREAM_KEY)
    gws = []
    try:
        for i, tree in enumerate(a.trees):
            out = work / f"counts{i}.json"
            g, url, key = tree_gateway.start(
                i, tree, work=work, logs=logs, upstream_url=upurl, redis_port=rport,
                env={"TASK_STEPS_OUT": str(out)}, command=[sys.executable, "-c", _LAUNCHER])
            gws.append((g, url, key, out))
            print(f"tree={i} {tree}", flush=True)
        for _, url, key, _ in gws:
            procs.run_wrk(f"{url}/v1/chat/completions", connections=32, duration_s=2,
                          env=wrk_env(key, "governed", False), out_dir=work)
        for c in a.c:
            for i, (_, url, key, out) in enumerate(gws):
                before = settled(out)
                res = procs.run_wrk(f"{url}/v1/chat/completions", connections=c,
                                    duration_s=a.d, env=wrk_env(key, "governed", False),
                                    out_dir=work)
                after = settled(out)
                n = res["requests"] + c
                names = {k: (v - before["names"].get(k, 0)) / n
                         for k, v in after.pop("names").items()}
                before.pop("names")
                per = {k: (after[k] - before[k]) / n for k in after}
                rps = res["requests"] / res["duration_us"] * 1e6
                print(f"c={c:5d} tree={i} rps={rps:7.1f} task_steps/req={per['steps']:.1f} "
                      f"spawned/req={per['spawned']:.2f} loop_passes/req={per['passes']:.2f}",
                      flush=True)
                if a.names:
                    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
                    print("    steps by task name:",
                          ", ".join(f"{k.rsplit('.', 1)[-1]} {v:.2f}" for k, v in top))
    finally:
        for g, *_ in gws:
            g.stop()
        up.stop()
        redis.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
