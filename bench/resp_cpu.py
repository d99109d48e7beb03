"""CPU per Redis pipeline of ``RespBackend.execute``, trees alternating.

    python bench/resp_cpu.py /tmp/base-tree "$PWD" -c 32 -n 20000 --rounds 5

Each tree runs in its own process (``PYTHONPATH=<tree>``): ``-c`` tasks share one
``RespBackend`` (pool of 32) on one Redis started here, and send ``-n`` pipelines in all,
each ``SET`` + ``GET`` + an ``EVALSHA`` of ~60 arguments (the shape of an admission round).
Reported: the process's CPU time (user + system) per pipeline, in µs. Only the client side
is measured, the gateway's share of a governed request's Redis round trips without
the rest of the request, so a change of a few µs per pipeline shows through host noise
that hides it in ``ab.py`` (rounds alternate; compare the medians).

``--callgrind`` runs each child under ``valgrind --tool=callgrind`` twice, with ``-n`` and
``2n`` pipelines, and reports the difference of the instructions counted over ``n``:
instructions per pipeline, start-up and warm-up cancelled out, independent of the host's
load (use a smaller ``-n``, e.g. 2000: valgrind is ~50x slower).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import load_procs as procs

CHILD = r"""
import sys, time, trio
from triogate.batch import RespBackend
url, tasks, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
SCRIPT = "return #ARGV"
async def main():
    backend = RespBackend(url, pool_size=32, command_timeout_s=5.0)
    (sha,) = await backend.execute([("SCRIPT", "LOAD", SCRIPT)])
    args = [f"tg:{{key:{'a' * 40}}}:rl:{i}" for i in range(20)] + list(range(10**12, 10**12 + 40))
    wire = ("EVALSHA", sha, 0, *args)
    async def worker(i, n):
        for j in range(n):
            replies = await backend.execute([("SET", f"k{i}", j), ("GET", f"k{i}"), wire])
            assert replies[2] == len(args), replies
    async def run(n):
        async with trio.open_nursery() as nursery:
            for i in range(tasks):
                nursery.start_soon(worker, i, n // tasks)
    await run(tasks * 50)  # warm-up: connections open, code paths hot
    t0 = time.process_time()
    await run(total)
    cpu = time.process_time() - t0
    print(f"{cpu / (total // tasks * tasks) * 1e6:.2f}")
    await backend.aclose()
trio.run(main)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="+")
    p.add_argument("-c", type=int, default=32, help="concurrent tasks")
    p.add_argument("-n", type=int, default=20000, help="pipelines per point")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--callgrind", action="store_true", help="instructions, not CPU time")
    a = p.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="resp-cpu-"))
    redis, port = procs.start_redis(logs)
    results: dict[int, list[float]] = {i: [] for i in range(len(a.trees))}
    try:
        for r in range(a.rounds):
            for i, tree in enumerate(a.trees):
                env = {**os.environ, "PYTHONPATH": tree, "PYTHONSAFEPATH": "1"}
                if a.callgrind:
                    ir = [collected(env, port, a.c, n) for n in (a.n, 2 * a.n)]
                    per = (ir[1] - ir[0]) / a.n
                    results[i].append(per)
                    print(f"r{r} tree={i} Ir/pipeline={per:,.0f}", flush=True)
                    continue
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, f"redis://127.0.0.1:{port}", str(a.c),
                     str(a.n)], env=env, capture_output=True, text=True, check=True)
                us = float(out.stdout.strip())
                results[i].append(us)
                print(f"r{r} tree={i} cpu_us/pipeline={us:.2f}", flush=True)
    finally:
        redis.stop()
    base = statistics.median(results[0])
    for i, tree in enumerate(a.trees):
        med = statistics.median(results[i])
        unit = "Ir" if a.callgrind else "us"
        print(f"tree={i} {tree} median={med:,.2f} {unit} ratio={med / base:.4f}")


def collected(env: dict[str, str], port: int, tasks: int, n: int) -> int:
    """Instructions the child executed under callgrind (``Collected :`` on its stderr)."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         "-c", CHILD, f"redis://127.0.0.1:{port}", str(tasks), str(n)],
        env=env, capture_output=True, text=True, check=True)
    match = re.search(r"Collected : (\d+)", out.stderr)
    if match is None:
        raise SystemExit(out.stderr[-2000:])
    return int(match.group(1))


if __name__ == "__main__":
    main()
