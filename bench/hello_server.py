"""CPU per request of the HTTP server alone: a raw ASGI hello-world on hypercorn's trio
worker and on ``triogate.server``, side by side.

    python bench/hello_server.py -c 32 256 -d 5 --rounds 2

Each server runs in its own process (the gateway worker's collector settings), wrk drives
it with keep-alive connections (``GET /``, a 13-byte answer with ``content-length``); the
server process's CPU (user + system, psutil) over wrk's requests is its CPU per request.
The servers alternate within each round, so read their ratio within one run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import load_procs as procs  # noqa: E402
from send_floor import run_server, wait_listening  # noqa: E402

BODY = b"Hello, world!"


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            event = (await receive())["type"]
            await send({"type": event + ".complete"})
            if event == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", b"%d" % len(BODY))]})
    await send({"type": "http.response.body", "body": BODY})


def wrk(port: int, connections: int, seconds: int) -> tuple[int, float]:
    """Requests completed and wrk's req/s."""
    out = subprocess.run(["wrk", "-t", str(min(2, connections)), "-c", str(connections),
                          "-d", f"{seconds}s", f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{errors.group(1)} errors: {out}")
    return requests, rate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-c", type=int, nargs="+", default=[32, 256])
    p.add_argument("-d", type=int, default=5, help="seconds per point")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--servers", nargs="+", default=["hypercorn", "triogate"],
                   choices=["hypercorn", "triogate"])
    p.add_argument("--serve", nargs=2, metavar=("PORT", "SERVER"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        run_server(a.serve[1], hello, int(a.serve[0]))
        return 0
    rows: dict[tuple[int, str, int], tuple[float, float]] = {}
    for rnd in range(a.rounds):
        for kind in a.servers:
            port = procs.free_port()
            server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), kind])
            try:
                wait_listening(port)
                proc = psutil.Process(server.pid)
                wrk(port, 32, 1)  # warm-up
                for c in a.c:
                    before = sum(proc.cpu_times()[:2])
                    requests, rate = wrk(port, c, a.d)
                    cpu = sum(proc.cpu_times()[:2]) - before
                    rows[rnd, kind, c] = (cpu * 1e6 / requests, rate)
                    print(f"round {rnd + 1} {kind:<10} c={c:<5} {rate:8.0f} req/s "
                          f"{cpu * 1e6 / requests:7.1f} us CPU/request", flush=True)
            finally:
                server.terminate()
                server.wait(30)
            time.sleep(0.5)
    if len(a.servers) == 2:
        one, two = a.servers
        print(f"\nratios {two}/{one} (CPU per request, req/s):")
        for rnd in range(a.rounds):
            for c in a.c:
                cpu = rows[rnd, two, c][0] / rows[rnd, one, c][0]
                rate = rows[rnd, two, c][1] / rows[rnd, one, c][1]
                print(f"  round {rnd + 1} c={c:<5} CPU x{cpu:.2f}  req/s x{rate:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
