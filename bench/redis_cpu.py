"""Redis server cost per governed request, from the server's side, for one or more trees.

For each tree (in turn, ``--rounds`` times, alternating), a child process with that tree
first on its import path starts a private Redis-compatible server (``--server``; the
embedded valkey-server by default) and an in-process gateway of that tree: two deployments
with usage-based routing, the response cache on, a key in a team (both with a budget and
RPM/TPM) and an end user with a budget and RPM, the shape of ``bench/load.py``. After a
warm-up it sends ``--requests`` unique chat completions over ``--connections`` connections,
waits until the settler drained, and reads from the server:

* ``used_cpu_sys + used_cpu_user`` (the server's own CPU) per request;
* ``INFO commandstats`` µs per request (all commands, and EVALSHA alone), calls per request;
* with ``--callgrind``: the server runs under ``valgrind --tool=callgrind``, collection
  switched on only for the measured requests (``callgrind_control -i``), and the child
  prints instructions per request, inclusive, for the server's main parts (command
  dispatch, EVALSHA, ``redis.call`` from scripts, reading/writing clients, the event loop).
  Deterministic up to the request ids, so trees compare on a loaded host.

    PYTHONPATH=. python bench/redis_cpu.py /tmp/base-redis /work/wt/redis --requests 2000
    PYTHONPATH=. python bench/redis_cpu.py /tmp/base-redis . --callgrind --requests 300
    PYTHONPATH=. python bench/redis_cpu.py /tmp/base . .@nomerge --callgrind --connections 32

``TREE@nomerge`` runs TREE with ``governance.merge_settlements: false``; each run also
prints the settler's post-call batches per flush (how much group commit happened). With
many connections under callgrind the server is slow, so group commits are large and
their size varies from run to run: the instruction counts then move by a few percent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Inclusive callgrind costs reported (the first name found per row).
PARTS = (
    ("event loop (all)", ("aeProcessEvents",)),
    ("read+parse requests", ("readQueryFromClient",)),
    ("command dispatch (call)", ("call",)),
    ("EVALSHA", ("evalShaCommand",)),
    ("redis.call from Lua", ("luaRedisCallCommand", "luaRedisGenericCommand")),
    ("  its commands (scriptCall)", ("scriptCall",)),
    ("Lua interpreter (luaV_execute)", ("luaV_execute",)),
    ("write replies", ("handleClientsWithPendingWrites",
                       "handleClientsWithPendingWritesUsingThreads", "writeToClient")),
)


def child(args: argparse.Namespace) -> None:
    import httpx
    import trio

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import governed_shape

    from tests.e2e.conftest import running_gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import open_fake_upstream

    async def info(redis: RespBackend) -> dict[str, Any]:
        cpu, stats = await redis.execute([("INFO", "cpu"), ("INFO", "commandstats")])
        assert isinstance(cpu, bytes) and isinstance(stats, bytes)
        out: dict[str, Any] = {"calls": {}, "usec": {}}
        for line in (cpu + stats).decode().splitlines():
            name, _, value = line.partition(":")
            if name in ("used_cpu_sys", "used_cpu_user"):
                out[name] = float(value)
            elif name.startswith("cmdstat_"):
                f = dict(kv.split("=") for kv in value.split(","))
                out["calls"][name[8:]] = int(f["calls"])
                out["usec"][name[8:]] = int(f["usec"])
        return out

    async def run(folder: Path) -> dict[str, Any]:
        sock = folder / "r.sock"
        cg_out = folder / "cg.out"
        argv = [args.server, "--port", "0", "--unixsocket", str(sock), "--save", "",
                "--appendonly", "no", "--daemonize", "no"]
        if args.callgrind:
            argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg_out}",
                    "--instr-atstart=no", *argv]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"unix://{sock}"
        for _ in range(1200):
            if sock.exists():
                break
            await trio.sleep(0.05)
        redis = RespBackend(url, command_timeout_s=60)
        try:
            # --no-merge: settlements one call each (a tree that knows the setting; w5-agg
            # and later)
            settings = {"governance": {"merge_settlements": False}} if args.no_merge else {}
            async with open_fake_upstream() as upstream, running_gateway(
                    governed_shape.config(folder, url, upstream.base_url, **settings)
            ) as gateway, httpx.AsyncClient(timeout=120) as http:
                assert gateway.services.store is not None
                key = await governed_shape.principals(gateway.services.store)
                base = gateway.openai_base
                conns = args.connections
                await governed_shape.send(http, base, key, args.warmup, "warm-up", conns)
                await gateway.services.settler.wait_drained()
                if args.callgrind:
                    await trio.run_process(["callgrind_control", "-i", "on",
                                            str(server.pid)], capture_stdout=True)
                before = await info(redis)
                settled0 = gateway.services.settler.statistics()
                t0 = time.perf_counter()
                await governed_shape.send(http, base, key, args.requests, "measured", conns)
                await gateway.services.settler.wait_drained()
                wall = time.perf_counter() - t0
                after = await info(redis)
                settled1 = gateway.services.settler.statistics()
                if args.callgrind:
                    await trio.run_process(["callgrind_control", "-i", "off",
                                            str(server.pid)], capture_stdout=True)
        finally:
            with contextlib.suppress(Exception):  # the shutdown's reply never comes
                await redis.execute([("SHUTDOWN", "NOSAVE")])
            await redis.aclose()
            await trio.to_thread.run_sync(server.wait, 300)
        n = args.requests
        calls = {k: after["calls"][k] - before["calls"].get(k, 0) for k in after["calls"]}
        usec = {k: after["usec"][k] - before["usec"].get(k, 0) for k in after["usec"]}
        for k in ("info",):
            calls.pop(k, None)
            usec.pop(k, None)
        cpu = (after["used_cpu_sys"] + after["used_cpu_user"]
               - before["used_cpu_sys"] - before["used_cpu_user"])
        result: dict[str, Any] = {
            "requests": n, "wall_s": wall,
            "server_cpu_ms_per_request": cpu * 1000 / n,
            "commandstats_us_per_request": sum(usec.values()) / n,
            "evalsha_us_per_request": (usec.get("evalsha", 0) + usec.get("eval", 0)) / n,
            "commands_per_request": {k: round(v / n, 2) for k, v in sorted(calls.items()) if v},
            "usec_per_request": {k: round(v / n, 2) for k, v in sorted(usec.items()) if v},
            # group commit: post-call batches per settler flush
            "batches_per_flush": round((settled1.batches - settled0.batches)
                                       / max(1, settled1.flushes - settled0.flushes), 2),
        }
        if args.callgrind:
            result["callgrind"] = _callgrind(cg_out, n)
        return result

    with tempfile.TemporaryDirectory(prefix="triogate-rcpu-") as tmp:
        print(json.dumps(trio.run(run, Path(tmp))))


def _callgrind(out: Path, n: int) -> dict[str, float]:
    files = [str(p) for p in out.parent.glob(out.name + "*")]
    if not files:
        raise SystemExit(f"no callgrind output in {sorted(os.listdir(out.parent))}")
    if os.environ.get("CG_KEEP"):
        subprocess.run(["cp", *files, os.environ["CG_KEEP"]], check=False)
    total = 0
    for name in files:
        for line in Path(name).read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total += int(line.split()[1])
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                                *files], capture_output=True, text=True).stdout
    incl: dict[str, int] = {}
    for line in annotated.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[0][0].isdigit() or not parts[1].startswith("("):
            continue
        fn = parts[2].rsplit(":", 1)[-1]
        if "'" in fn:  # a recursive level: counted in the outer one
            continue
        incl[fn] = max(incl.get(fn, 0), int(parts[0].replace(",", "")))
    rows = {"total": total / n}
    for label, names in PARTS:
        for name in names:
            if name in incl:
                rows[label] = incl[name] / n
                break
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*",
                        help="tree folders; TREE@nomerge runs TREE with --no-merge")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--no-merge", action="store_true",
                        help="governance.merge_settlements: false (trees that know it)")
    parser.add_argument("--server", default=None)
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        sys.path.insert(0, str(args.child))
        if args.server is None:
            from triogate.redis_server import find_server_binary
            args.server = find_server_binary()
        child(args)
        return
    results: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(args.rounds):
        for spec in args.trees:
            name, _, flag = spec.partition("@")
            tree = Path(name).resolve()
            argv = [sys.executable, "-P", __file__, "--child", str(tree),
                    "--requests", str(args.requests), "--warmup", str(args.warmup),
                    "--connections", str(args.connections)]
            if args.callgrind:
                argv.append("--callgrind")
            if args.no_merge or flag == "nomerge":
                argv.append("--no-merge")
            if args.server:
                argv += ["--server", args.server]
            env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"{tree}: child failed")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            results.setdefault(spec, []).append(r)
            line = (f"round {round_ + 1} {spec}: server CPU "
                    f"{r['server_cpu_ms_per_request']:.3f} ms/req, commandstats "
                    f"{r['commandstats_us_per_request']:.1f} µs/req (EVALSHA "
                    f"{r['evalsha_us_per_request']:.1f}), "
                    f"{sum(r['commands_per_request'].values()):.1f} commands/req, "
                    f"{r['requests'] / r['wall_s']:.0f} req/s, "
                    f"{r['batches_per_flush']} batches/flush")
            print(line, flush=True)
            if "callgrind" in r:
                print("   " + ", ".join(f"{k} {v / 1000:,.1f}k" for k, v in r["callgrind"].items()),
                      flush=True)
            print("   commands/req " + json.dumps(r["commands_per_request"]), flush=True)


if __name__ == "__main__":
    main()
