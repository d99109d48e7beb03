"""Instructions per governed request inside Redis's EVALSHA, under callgrind: deterministic,
so two trees compare on a loaded host where µs figures move by ±30 % between runs.

Starts ``redis-server`` under ``valgrind --tool=callgrind`` (only EVALSHA is collected),
loads the tree's Lua scripts and runs, one request at a time, the script sequence a
governed request makes (as traced from the gateway: routing_state; rate_admit,
budget_reserve for a key and a team with budgets and RPM/TPM, and an end user with a
budget and RPM; then budget_settle, rate_settle, routing_record). Prints instructions (Ir)
per request and the redis.call commands per request.

    python bench/script_instructions.py TREE [TREE ...] [--requests 200]
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import tempfile
import time
from pathlib import Path

import redis

#: The tree being measured writes routing markers as fields of a HASH per minute.
RECS = False
NAMES = ("routing_state", "rate_admit", "budget_reserve", "budget_settle", "rate_settle",
         "routing_record")
#: (kind, rate windows, budget TTL ms): TTL 0 is a lifetime budget.
PRINCIPALS = (("key", (("r", 10**6), ("t", 10**9)), 172_799_525),
              ("team", (("r", 10**6), ("t", 10**9)), 2_678_399_525),
              ("eu", (("r", 10**6),), 0))


def request(p: redis.client.Pipeline, sha: dict[str, str], i: int) -> None:
    now = int(time.time() * 1000)
    rid, minute, bucket = f"r{i:08d}{now}", now // 60_000, now // 1000
    g = "tg:{rt:g}"
    p.evalsha(sha["routing_state"], 5, f"{g}:usage:{minute}", f"{g}:cooldown", f"{g}:latency",
              f"{g}:inflight:a", f"{g}:inflight:b", now, "read", rid, 600_000, 300, i % 2,
              "a", 0, 0, "b", 0, 0)
    tags = [f"tg:{{{kind}:x}}" for kind, _, _ in PRINCIPALS]
    for t, (_, wins, _) in zip(tags, PRINCIPALS, strict=True):
        keys = [f"{t}:rl:rpm", f"{t}:rl:tpm"][: len(wins)]
        p.evalsha(sha["rate_admit"], len(keys), *keys, now, rid, 222, 600_000,
                  *[v for w in wins for v in w])
    for t, (_, _, ttl) in zip(tags, PRINCIPALS, strict=True):
        b = f"{t}:bud:7"
        p.evalsha(sha["budget_reserve"], 3, b, f"{b}:res", f"{b}:exp", now, rid, 39_000,
                  10**15, 600_000, ttl)
    for t, (_, _, ttl) in zip(tags, PRINCIPALS, strict=True):
        b = f"{t}:bud:7"
        p.evalsha(sha["budget_settle"], 4, b, f"{b}:res", f"{b}:exp", f"{t}:bud:done:{minute}",
                  rid, 35_000, ttl, 660_000)
    for t, (_, wins, _) in zip(tags, PRINCIPALS, strict=True):
        keys = [f"{t}:rl:rpm", f"{t}:rl:tpm"][: len(wins)]
        p.evalsha(sha["rate_settle"], len(keys) + 1, *keys, f"{t}:rl:done:{minute}", rid, "a",
                  bucket, 222, 200, now, 660_000, *[w[0] for w in wins])
    # routing markers: a HASH per minute since w5-redis (recs:), a STRING per request before
    marker = f"{g}:recs:{minute}" if RECS else f"{g}:rec:{rid}"
    p.evalsha(sha["routing_record"], 4, marker, f"{g}:usage:{minute}", f"{g}:cooldown",
              f"{g}:latency", now, rid, 660_000 if RECS else 600_000, 120_000, 3, 5000, "0.3",
              3_600_000,
              "a" if i % 2 else "b", "ok", 21, "0.077")


def measure(tree: Path, requests: int, warm: int = 100) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as work:
        sock, out = f"{work}/r.sock", f"{work}/cg.out"
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             "--collect-atstart=no", "--toggle-collect=evalShaCommand", "redis-server",
             "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                if os.path.exists(sock):
                    break
                time.sleep(0.1)
            r = redis.Redis(unix_socket_path=sock)
            sha = {n: r.script_load((tree / "triogate" / "lua" / f"{n}.lua").read_text())
                   for n in NAMES}
            global RECS
            RECS = "recs:" in (tree / "triogate" / "lua" / "routing_record.lua").read_text()
            for i in range(warm + requests):
                if i == warm:
                    r.config_resetstat()
                p = r.pipeline(transaction=False)
                request(p, sha, i)
                p.execute()
            stats = r.info("commandstats")
            inner = sum(v["calls"] for k, v in stats.items()
                        if k not in ("cmdstat_evalsha", "cmdstat_config", "cmdstat_info"))
            r.shutdown(nosave=True)
        except redis.exceptions.ConnectionError:
            pass  # the shutdown's reply
        finally:
            server.wait(120)
        total = 0
        for name in glob.glob(out + "*"):
            for line in Path(name).read_text().splitlines():
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
        return total / (warm + requests), inner / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    first = None
    for tree in args.trees:
        ir, calls = measure(tree, args.requests)
        first = first or ir
        print(f"{tree}: {ir:,.0f} instructions in EVALSHA per request ({ir / first:.3f} of the "
              f"first), {calls:.1f} redis.call per request")


if __name__ == "__main__":
    main()
