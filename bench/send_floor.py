"""What a server's per-send path costs: the floor under the gateway's CPU per stream chunk.

    python bench/send_floor.py --streams 512 --rate 512 [--rounds 2]
                               [--servers hypercorn triogate]

A bare ASGI app on each server (hypercorn's trio worker; ``triogate.server``, the
gateway's own) forwards each of ``bench/streamtool.c client``'s streaming requests to
``streamtool upstream`` through the gateway's own upstream transport
(``new_upstream_client``), handing the body's bytes on as they come: no SSE parsing, no
JSON, no governance. Two modes:

* ``forward``: one ``http.response.body`` per upstream read (the least a pass-through
  forwarder does per chunk: wake on the upstream socket, read, send);
* ``read``: the same reads, the bytes sent in one message at the end.

Per mode, two runs (``--chunks`` and ``--baseline-chunks``); the server's CPU difference
divided by the chunk difference is the marginal CPU per chunk. ``forward`` minus ``read``
is what one ASGI send costs (on hypercorn: its message handling, h11's chunked framing,
its send lock and shielded cancel scope, trio's socket send and the run-loop pass after
it). The servers alternate within each round, so their ratio is read within one run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import load_procs as procs  # noqa: E402
import streams  # noqa: E402


def app_factory(mode: str, upstream_port: int) -> Any:
    from triogate.providers import new_upstream_client

    client: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = (await receive())["type"]
                if event == "lifespan.startup":
                    client.append(new_upstream_client(max_connections=8192))
                await send({"type": event + ".complete"})
                if event == "lifespan.shutdown":
                    return
        if not client:  # triogate.server runs no lifespan: the first request makes it
            client.append(new_upstream_client(max_connections=8192))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = client[0].build_request(
            "POST", f"http://127.0.0.1:{upstream_port}/v1/chat/completions", content=body,
            headers={"content-type": "application/json", "authorization": "Bearer x"})
        response = await client[0].send(request, stream=True)
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            held: list[bytes] = []
            async for chunk in response.stream:  # type: ignore[union-attr]
                if mode == "forward":
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                else:
                    held.append(chunk)
            await send({"type": "http.response.body", "body": b"".join(held),
                        "more_body": False})
        finally:
            await response.aclose()

    return app


def run_server(kind: str, app: Any, port: int) -> None:
    """Serve ``app`` on ``port`` with ``kind`` (hypercorn or triogate) until killed."""
    import gc

    import trio

    from triogate.app import GC_THRESHOLDS

    gc.freeze()  # the collector as the gateway's worker runs it (triogate/app.py)
    gc.set_threshold(*GC_THRESHOLDS)
    if kind == "hypercorn":
        from hypercorn.config import Config
        from hypercorn.trio import serve as hypercorn_serve

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.backlog = 4096
        config.accesslog = None
        trio.run(hypercorn_serve, app, config)
    else:
        from triogate.server import ServerConfig
        from triogate.server import serve as triogate_serve

        trio.run(lambda: triogate_serve(app, ServerConfig(), shutdown=trio.Event(), port=port))


def wait_listening(port: int, timeout_s: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def serve(port: int, mode: str, upstream_port: int, kind: str) -> None:
    run_server(kind, app_factory(mode, upstream_port), port)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=512)
    p.add_argument("--rate", type=float, default=512)
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--baseline-chunks", type=int, default=10)
    p.add_argument("--interval-ms", type=float, default=50)
    p.add_argument("--servers", nargs="+", default=["hypercorn", "triogate"],
                   choices=["hypercorn", "triogate"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--serve", nargs=4, metavar=("PORT", "MODE", "UPSTREAM", "SERVER"),
                   help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        serve(int(a.serve[0]), a.serve[1], int(a.serve[2]), a.serve[3])
        return 0
    tool = streams.build_tool()
    uport = procs.free_port()
    upstream = subprocess.Popen([str(tool), "upstream", str(uport), str(a.interval_ms)],
                                stdout=subprocess.DEVNULL)
    figures: dict[tuple[int, str, str], float] = {}
    try:
        for rnd in range(a.rounds):
            for kind in a.servers:
                for mode in ("forward", "read"):
                    figures[rnd, kind, mode] = point(a, kind, mode, uport)
    finally:
        upstream.terminate()
        upstream.wait(10)
    print("\nmarginal CPU per chunk (us): round, server, forward, read only, one ASGI send")
    for rnd in range(a.rounds):
        for kind in a.servers:
            fwd, read = figures[rnd, kind, "forward"], figures[rnd, kind, "read"]
            print(f"  {rnd + 1} {kind:<10} {fwd:7.1f} {read:7.1f} {fwd - read:7.1f}")
        if len(a.servers) == 2:
            one, two = a.servers
            print(f"  {rnd + 1} ratio {two}/{one}: forward "
                  f"{figures[rnd, two, 'forward'] / figures[rnd, one, 'forward']:.2f}, send "
                  f"{_ratio(figures, rnd, two, one)}")
    return 0


def _ratio(figures: dict[tuple[int, str, str], float], rnd: int, two: str, one: str) -> str:
    send_two = figures[rnd, two, "forward"] - figures[rnd, two, "read"]
    send_one = figures[rnd, one, "forward"] - figures[rnd, one, "read"]
    return f"{send_two / send_one:.2f}" if send_one > 0 else "-"


def point(a: argparse.Namespace, kind: str, mode: str, uport: int) -> float:
    """One server process in one mode: its marginal CPU per chunk (us)."""
    port = procs.free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), mode,
                               str(uport), kind])
    try:
        wait_listening(port)
        proc = psutil.Process(server.pid)
        cpu: dict[int, float] = {}
        for chunks in (a.chunks, a.baseline_chunks):
            before = sum(proc.cpu_times()[:2])
            result = streams.client(port, streams=a.streams, rate=a.rate, auth="Bearer x",
                                    model="floor", chunks=chunks, timeout_s=180)
            time.sleep(0.5)
            cpu[chunks] = sum(proc.cpu_times()[:2]) - before
            print(f"{kind:<10} {mode:<7} {chunks:>4} chunks: ok {result['ok']}/"
                  f"{result['streams']} server CPU {cpu[chunks]:.2f} s", flush=True)
        diff = a.streams * (a.chunks - a.baseline_chunks)
        return (cpu[a.chunks] - cpu[a.baseline_chunks]) * 1e6 / diff
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
