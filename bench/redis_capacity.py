"""How many governed requests a second one Redis core carries: the gateway's own traffic,
captured, then replayed from many connections at once.

Why this exists: the server's CPU per request measured with one gateway (``bench/load.py``)
is taken on this 2-core host, so the server wakes up for one small pipeline at a time and
shares the machine with the gateway that feeds it. A wake-up costs the server a ``read``,
a ``write`` and an ``epoll_wait`` (17-20 µs of system time each on this VM) and runs the
scripts on cold caches. That is the cost at *one* gateway's load, not the server's
capacity: with a fleet of gateways in front of it, each wake-up finds many clients'
pipelines ready. This bench measures that case without a fleet:

1. **Capture.** An in-process gateway (the shape of ``bench/load.py``: a key in a team,
   both with a budget and RPM/TPM, an end user with a budget and RPM, usage-based routing
   over two deployments, the response cache on) serves ``--requests`` unique chat
   completions after a warm-up; every pipeline its Redis backend sends is recorded as
   sent (fused scripts, merged settlements, the settler's group commits, cache reads and
   writes). Each request carries an ``x-request-id`` of its own, so the ids in the
   captured arguments are known.
2. **Replay.** A fresh server (pinned to the last CPU with ``taskset`` when there are at
   least two) gets every script the capture loaded; then, for each concurrency ``C`` of
   ``--concurrency``, ``C`` connections each replay their own copy of the measured
   pipelines in order (a copy's request ids are suffixed, so every copy reserves, counts
   and settles as new requests on the same hot key, team, end user and model group: the
   fleet's hot-principal case). One pipeline in flight per connection, as a gateway's
   request waits for its round. The driver is one process of raw sockets and hiredis.

It prints, per ``C``: governed requests a second, the server's CPU (``used_cpu_sys +
used_cpu_user``) per request, its share of one core, and ``INFO commandstats`` µs per
request. When the server's share of its core is near 100 %, requests a second is what one
core carries for this shape; when it is not, the driver was the limit (said in the row).

    python bench/redis_capacity.py                       # 400 requests, C = 1 8 32 128
    python bench/redis_capacity.py --server /usr/bin/redis-server --concurrency 1 64
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import re
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

Pipeline = list[tuple[bytes, ...]]


def _as_bytes(arg: object) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, (bytearray, memoryview)):
        return bytes(arg)
    return str(arg).encode()


def capture(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Run the gateway and return its pipelines (measured part) and every script it loaded."""
    import httpx
    import trio

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import governed_shape

    from tests.e2e.conftest import running_gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import open_fake_upstream

    recorded: list[Pipeline] = []
    scripts: dict[bytes, None] = {}
    recording = [False]
    original = RespBackend.execute

    async def execute(self: RespBackend, commands: Any) -> list[object]:
        wires = [tuple(_as_bytes(a) for a in c) for c in commands]
        measured = []
        for wire in wires:
            if wire[:2] == (b"SCRIPT", b"LOAD"):
                scripts[wire[2]] = None
            else:
                measured.append(wire)
        if recording[0] and measured:
            recorded.append(measured)
        return await original(self, commands)

    RespBackend.execute = execute  # type: ignore[method-assign]

    async def run() -> None:
        sock = folder / "capture.sock"
        server = subprocess.Popen([args.server, "--port", "0", "--unixsocket", str(sock),
                                   "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"unix://{sock}"
        try:
            for _ in range(200):
                if sock.exists():
                    break
                await trio.sleep(0.05)
            async with open_fake_upstream() as upstream, running_gateway(
                    governed_shape.config(folder, url, upstream.base_url)) as gateway, \
                    httpx.AsyncClient(timeout=120) as http:
                assert gateway.services.store is not None
                key = await governed_shape.principals(gateway.services.store)
                base = gateway.openai_base
                n = args.capture_connections
                await governed_shape.send(http, base, key, args.warmup, "warm", n,
                                          request_ids=True)
                await gateway.services.settler.wait_drained()
                recording[0] = True
                await governed_shape.send(http, base, key, args.requests, "cap", n,
                                          request_ids=True)
                await gateway.services.settler.wait_drained()
                recording[0] = False
        finally:
            server.kill()
            server.wait()

    trio.run(run)
    RespBackend.execute = original  # type: ignore[method-assign]
    return {"pipelines": recorded, "scripts": list(scripts)}


def _copy(pipelines: list[Pipeline], suffix: bytes) -> list[tuple[bytes, int]]:
    """The measured pipelines packed, every captured request id given ``suffix``."""
    import hiredis

    rename = re.compile(rb"(cap[0-9]{6}x)")
    repl = rb"\1" + suffix
    out = []
    for pipeline in pipelines:
        packed = b"".join(hiredis.pack_command(tuple(
            rename.sub(repl, a) if b"cap" in a else a for a in wire)) for wire in pipeline)
        out.append((packed, len(pipeline)))
    return out


def _failed(reply: object) -> bool:
    """An error reply, or a fused script's reply whose last element lists raised errors
    (``triogate/batch/_fusion.py``): the replay would not be the gateway's work."""
    import hiredis

    if isinstance(reply, hiredis.ReplyError):
        return True
    return isinstance(reply, list) and bool(reply) and isinstance(reply[-1], list) and any(
        isinstance(e, list) for e in reply[-1])


def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def _info(conn: socket.socket) -> dict[str, Any]:
    import hiredis

    reader = hiredis.Reader()
    conn.sendall(hiredis.pack_command(("INFO", "cpu")) + hiredis.pack_command(
        ("INFO", "commandstats")))
    replies: list[Any] = []
    while len(replies) < 2:
        reply = reader.gets()
        if reply is False:
            reader.feed(conn.recv(1 << 16))
            continue
        replies.append(reply)
    out: dict[str, Any] = {"usec": 0, "calls": 0}
    for line in (replies[0] + replies[1]).decode().splitlines():
        name, _, value = line.partition(":")
        if name in ("used_cpu_sys", "used_cpu_user"):
            out[name] = float(value)
        elif name.startswith("cmdstat_") and name != "cmdstat_info":
            fields = dict(kv.split("=") for kv in value.split(","))
            out["usec"] += int(fields["usec"])
            out["calls"] += int(fields["calls"])
    return out


def _replay(path: str, copies: list[list[tuple[bytes, int]]], gap_s: float = 0.0,
            group: int = 1) -> float:
    """Each copy on its own connection, one pipeline in flight each; a connection waits
    ``gap_s`` between a pipeline's last reply and its next pipeline (a gateway's own work
    between its requests' rounds). ``group`` > 1 sends that many consecutive pipelines in
    one write (what a gateway coalescing the rounds of its concurrent requests would
    send) and waits ``gap_s * group`` after their replies, so the rate stays that of
    ``group`` 1. Returns wall seconds."""
    import hiredis

    sel = selectors.DefaultSelector()
    conns = []
    for copy in copies:
        conn = _connect(path)
        conn.setblocking(False)
        conns.append((conn, {"copy": copy, "next": 0, "want": 0, "reader": hiredis.Reader()}))
    waiting: list[tuple[float, int]] = []  # (when, index into conns): heap of paused sends

    def send_next(conn: socket.socket, state: dict[str, Any]) -> None:
        taken = state["copy"][state["next"]:state["next"] + group]
        state["next"] += len(taken)
        packed = b"".join(p for p, _ in taken)
        state["want"] = sum(c for _, c in taken)
        conn.setblocking(True)
        conn.sendall(packed)
        conn.setblocking(False)

    started = time.perf_counter()
    live = len(conns)
    for conn, state in conns:
        send_next(conn, state)
        sel.register(conn, selectors.EVENT_READ, state)
    index = {id(state): i for i, (_, state) in enumerate(conns)}
    while live:
        timeout = None
        if waiting:
            timeout = max(0.0, waiting[0][0] - time.perf_counter())
        for key, _ in sel.select(timeout):
            conn, state = key.fileobj, key.data
            reader = state["reader"]
            reader.feed(conn.recv(1 << 18))  # type: ignore[union-attr]
            while state["want"]:
                reply = reader.gets()
                if reply is False:
                    break
                if _failed(reply):
                    raise SystemExit(f"replay: a command failed: {reply!r:.300}")
                state["want"] -= 1
            if state["want"]:
                continue
            if state["next"] == len(state["copy"]):
                sel.unregister(conn)
                live -= 1
            elif gap_s:
                heapq.heappush(waiting,
                               (time.perf_counter() + gap_s * group, index[id(state)]))
            else:
                send_next(conn, state)  # type: ignore[arg-type]
        now = time.perf_counter()
        while waiting and waiting[0][0] <= now:
            _, i = heapq.heappop(waiting)
            send_next(*conns[i])
    wall = time.perf_counter() - started
    for conn, _ in conns:
        conn.close()
    return wall


def replay(args: argparse.Namespace, folder: Path, captured: dict[str, Any]) -> list[dict]:
    import hiredis

    sock = folder / "replay.sock"
    argv = [args.server, "--port", "0", "--unixsocket", str(sock), "--save", "",
            "--appendonly", "no"]
    pinned = bool(shutil.which("taskset")) and (os.cpu_count() or 1) >= 2
    if pinned:
        argv = ["taskset", "-c", str((os.cpu_count() or 2) - 1), *argv]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.05)
        probe = _connect(str(sock))
        reader = hiredis.Reader()
        for source in captured["scripts"]:
            probe.sendall(hiredis.pack_command(("SCRIPT", "LOAD", source)))
            while reader.gets() is False:
                reader.feed(probe.recv(1 << 16))
        pipelines = [[tuple(bytes.fromhex(a) for a in w) for w in p]
                     for p in captured["pipelines"]]
        # One warm-up copy: keys created, allocator warm.
        _replay(str(sock), [_copy(pipelines, b"-w")])
        for rnd in range(args.rounds):
            for c, gap_ms, group in [(c, g, k) for c in args.concurrency
                                     for g in args.gap_ms for k in args.group]:
                copies = [_copy(pipelines, f"-{rnd}-{c}-{gap_ms:g}-{group}-{i}".encode())
                          for i in range(c)]
                before = _info(probe)
                cpu0 = time.process_time()
                wall = _replay(str(sock), copies, gap_ms / 1000, group)
                driver = time.process_time() - cpu0
                after = _info(probe)
                n = args.requests * c
                cpu = (after["used_cpu_sys"] + after["used_cpu_user"]
                       - before["used_cpu_sys"] - before["used_cpu_user"])
                rows.append({
                    "round": rnd + 1, "concurrency": c, "gap_ms": gap_ms, "group": group,
                    "requests": n,
                    "pipelines_per_request": round(len(pipelines) / args.requests, 3),
                    "req_per_s": round(n / wall), "server_cpu_ms_per_request": cpu * 1000 / n,
                    "server_core_share": cpu / wall, "driver_core_share": driver / wall,
                    "sys_ms_per_request": (after["used_cpu_sys"] - before["used_cpu_sys"])
                    * 1000 / n,
                    "commandstats_us_per_request": (after["usec"] - before["usec"]) / n,
                    "pinned": pinned})
                r = rows[-1]
                print(f"round {rnd + 1} C={c:>4} gap {gap_ms:g} ms group {group}: "
                      f"{r['req_per_s']:>6} req/s, "
                      f"server "
                      f"{r['server_cpu_ms_per_request']:.3f} ms/req (sys "
                      f"{r['sys_ms_per_request']:.3f}), server core {r['server_core_share']:.0%}"
                      f", driver core {r['driver_core_share']:.0%}, commandstats "
                      f"{r['commandstats_us_per_request']:.0f} µs/req", flush=True)
        probe.close()
    finally:
        server.kill()
        server.wait()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests captured")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--capture-connections", type=int, default=32,
                        help="connections of the captured run (sets the settler's groups)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--group", type=int, nargs="+", default=[1],
                        help="consecutive pipelines sent in one write per connection")
    parser.add_argument("--gap-ms", type=float, nargs="+", default=[0.0],
                        help="pause of each connection between its pipelines (a gateway's own "
                             "work between rounds); every concurrency runs with every gap")
    parser.add_argument("--server", default=None,
                        help="server binary (default: the embedded valkey-server)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    parser.add_argument("--capture-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.server is None:
        sys.path.insert(0, str(ROOT))
        from triogate.redis_server import find_server_binary
        args.server = find_server_binary()
    with tempfile.TemporaryDirectory(prefix="triogate-cap-") as tmp:
        folder = Path(tmp)
        if args.capture_child is not None:
            captured = capture(args, folder)
            args.capture_child.write_text(json.dumps({
                "scripts": [s.decode() for s in captured["scripts"]],
                "pipelines": [[[a.hex() for a in w] for w in p]
                              for p in captured["pipelines"]]}))
            return
        # The capture runs in a child: its gateway and trio are gone before the replay.
        out = folder / "captured.json"
        subprocess.run([sys.executable, __file__, "--capture-child", str(out),
                        "--requests", str(args.requests), "--warmup", str(args.warmup),
                        "--capture-connections", str(args.capture_connections),
                        "--server", args.server], check=True, cwd=ROOT)
        captured = json.loads(out.read_text())
        print(f"captured {len(captured['pipelines'])} pipelines for {args.requests} "
              f"requests, {len(captured['scripts'])} scripts", flush=True)
        rows = replay(args, folder, captured)
    if args.out:
        args.out.write_text(json.dumps({"server": args.server, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
