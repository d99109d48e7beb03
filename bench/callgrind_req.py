"""Instructions per governed request: the worker under callgrind, trees alternating.

    python bench/callgrind_req.py /tmp/base-tree "$PWD" -c 32 -d 30 --rounds 2

Each tree's gateway (1 worker, governed as in ``ab.py``) runs under ``valgrind
--tool=callgrind``. Its counters are zeroed after start-up and a warm-up run
(``callgrind_control -z``) and dumped after one wrk run of ``-d`` seconds. The requests
counted are the growth of ``triogate_requests_total`` over the run (every request the
worker finished, the ones wrk left in flight included). Ir per request is exact for a
given code path and does not depend on the host's load, unlike CPU time, so it resolves
changes of a few per cent on a busy shared host. The Ir include the worker's background
tasks (settler, spend-log writer), which at a fixed concurrency grow with the requests,
and the one /metrics scrape; an idle worker's timers add ~200-400 Ir per request over a
run (measured once). Redis and post-call bounds are raised to 60 s: at the default 0.5 s
and 1 s, half the requests took the degraded paths under callgrind. The worker is ~50x
slower there while Redis and the upstream are not, so rounds batch less than at full
speed. ``--keep`` leaves the dumps as
``/tmp/cg-rR-tT.out`` (for ``callgrind_annotate``).
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import load as L
import load_procs as procs
import tree_gateway
from ab import wrk_env


def requests_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=60).text
    return sum(float(m.group(1)) for m in
               re.finditer(r'^triogate_requests_total\{[^}]*\} (\S+)$', text, re.M))


def ctl(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True,
                   timeout=300)


def total_ir(out: Path) -> int:
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="+")
    p.add_argument("-c", type=int, default=32)
    p.add_argument("-d", type=int, default=40, help="seconds per measured run")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--latency-ms", type=float, default=20)
    p.add_argument("--keep", action="store_true")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cg-"))
    logs = work / "logs"
    logs.mkdir()
    redis, rport = procs.start_redis(logs)
    up, upurl = procs.start_upstream(logs, latency_ms=a.latency_ms, api_key=L.UPSTREAM_KEY)
    gws = []
    try:
        for i, tree in enumerate(a.trees):
            # ~50x slower under callgrind: the default bounds (0.5 s for Redis, 1 s for the
            # post-call batches) would time out and measure the degraded paths instead.
            g, url, key = tree_gateway.start(
                i, tree, work=work, logs=logs, upstream_url=upurl, redis_port=rport,
                settings={"redis": {"timeout_s": 60}, "post_call_deadline_s": 60,
                          "max_admission_wait_s": 120},
                command=["valgrind", "--tool=callgrind",
                         f"--callgrind-out-file={work}/cg{i}.%p.out",
                         sys.executable, "-m", "triogate"],
                extra_args=("--workers", "1"), ready_timeout_s=600, settle_s=2)
            gws.append((g, url, key))
            print(f"tree={i} {tree}", flush=True)
        for _, url, key in gws:
            procs.run_wrk(f"{url}/v1/chat/completions", connections=a.c, duration_s=5,
                          env=wrk_env(key, "governed", False), out_dir=work)
        for r in range(a.rounds):
            for i, (g, url, key) in enumerate(gws):
                for old in work.glob(f"cg{i}.*.out*"):
                    old.unlink()
                before = requests_total(url)
                ctl("-z", str(g.pid))
                procs.run_wrk(f"{url}/v1/chat/completions", connections=a.c,
                              duration_s=a.d, env=wrk_env(key, "governed", False),
                              out_dir=work)
                time.sleep(3)  # the requests wrk left in flight finish
                ctl("-d", str(g.pid))
                n = requests_total(url) - before
                outs = sorted(work.glob(f"cg{i}.*.out*"), key=lambda f: f.stat().st_mtime)
                ir = total_ir(outs[-1])
                if a.keep:
                    outs[-1].rename(f"/tmp/cg-r{r}-t{i}.out")
                print(f"r{r} c={a.c} tree={i} requests={n:.0f} Ir/req={ir / n:,.0f}",
                      flush=True)
    finally:
        for g, *_ in gws:
            g.stop()
        up.stop()
        redis.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
