"""Redis CPU per governed request, one EVALSHA per script call vs fused, from one capture.

    PYTHONPATH=$PWD python bench/fusion_replay.py [requests]

Runs the flow of /work/notes/script_cost.py (an in-process gateway on a private
redis-server, one governed chat request after another), records every pipeline the flush
sends, then replays the whole capture on a fresh redis-server, alternately as lone
EVALSHAs and fused (``triogate/batch/_fusion.py``), from FLUSHALL each time, scripts
preloaded, and prints the server's CPU (INFO cpu) per request: the minimum and every
replay (``REPS``, default 8). It also checks that both give every command the same reply.
Only the server's work differs between the two: no gateway, no concurrency.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import hiredis
import httpx
import trio

from triogate.batch import Command, _flush
from triogate.batch._fusion import Fuser
from triogate.bench import roundtrips as rt

captured: list[list[Command]] = []
capturing = [False]
_send = _flush._send_pipeline


async def _spy(backend: Any, commands: Any, indices: Any, deliver: Any, sent: Any) -> None:
    if capturing[0]:
        captured.append([commands[i] for i in indices])
    await _send(backend, commands, indices, deliver, sent)


async def capture(sock: str, work: str, n: int) -> None:
    _flush._send_pipeline = _spy  # type: ignore[assignment]
    config = rt.bench_config(Path(work) / "s", f"unix://{sock}", rt.USAGE_BASED)
    async with rt.running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
        for i in range(20):
            await rt.send(gw, http, rt.SHAPES[0], f"warm {i}")
        await trio.sleep(1.5)
        capturing[0] = True
        for i in range(n):
            await rt.send(gw, http, rt.SHAPES[0], f"probe {i} {time.time()}")
        await trio.sleep(1.5)  # the settler's last group commit
        capturing[0] = False


def start(folder: str) -> tuple[subprocess.Popen[bytes], str]:
    os.makedirs(folder, exist_ok=True)
    sock = f"{folder}/r.sock"
    server = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock,
                               "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    for _ in range(50):
        if os.path.exists(sock):
            break
        time.sleep(0.1)
    return server, sock


def replay(sock: str, n: int, reps: int) -> None:
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(sock)
    reader = hiredis.Reader()

    def pipe(wires: list[tuple[Any, ...]]) -> list[Any]:
        conn.sendall(b"".join(hiredis.pack_command(w) for w in wires))
        out: list[Any] = []
        while len(out) < len(wires):
            reply = reader.gets()
            if reply is False:
                reader.feed(conn.recv(1 << 20))
                continue
            out.append(reply)
        return out

    def cpu() -> float:
        lines = pipe([("INFO", "cpu")])[0].decode().splitlines()
        info = dict(line.split(":", 1) for line in lines if ":" in line)
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    fuser = Fuser()
    plans = [[u for u in fuser.plan(p, range(len(p))) if u.members] for p in captured]
    for p, units in zip(captured, plans, strict=True):
        pipe([("SCRIPT", "LOAD", c.script.source) for c in p if c.script is not None])
        pipe([("SCRIPT", "LOAD", u.fused.script.source) for u in units if u.fused is not None])
    lone = [[c.wire() for c in p] for p in captured]
    fused = [[u.wire(p) for u in units] for p, units in zip(captured, plans, strict=True)]
    print(f"pipelines {len(captured)}, wires lone {sum(map(len, lone))}, "
          f"fused {sum(map(len, fused))}")
    pipe([("FLUSHALL",)])
    expected = [pipe(w) for w in lone]
    pipe([("FLUSHALL",)])
    same = 0
    for p, units, wires, want in zip(captured, plans, fused, expected, strict=True):
        got: list[object] = [None] * len(p)
        for unit, reply in zip(units, pipe(wires), strict=True):
            for i, own in zip(unit.members, unit.split(p, reply), strict=True):
                got[i] = own
        same += repr(got) == repr(want)
    print(f"pipelines with identical replies: {same} of {len(captured)}")
    results: dict[str, list[float]] = {"lone": [], "fused": []}
    for _ in range(reps):
        for name, wires_list in (("lone", lone), ("fused", fused)):
            pipe([("FLUSHALL",)])
            before = cpu()
            for wires in wires_list:
                pipe(wires)
            results[name].append((cpu() - before) * 1e6 / n)
    for name, values in results.items():
        print(f"{name:6s} redis CPU µs/request: min {min(values):.1f}; "
              + " ".join(f"{v:.0f}" for v in values))
    print(f"fused/lone (minima): {min(results['fused']) / min(results['lone']):.3f}")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as work:
        server, sock = start(work + "/capture")
        try:
            trio.run(capture, sock, work, n)
        finally:
            server.terminate()
        server, sock = start(work + "/replay")
        try:
            replay(sock, n, int(os.environ.get("REPS", "8")))
        finally:
            server.terminate()


if __name__ == "__main__":
    main()
