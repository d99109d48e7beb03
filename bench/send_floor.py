"""What hypercorn's per-send path costs: the floor under the gateway's CPU per stream chunk.

    python bench/send_floor.py --streams 512 --rate 512

A bare ASGI app on hypercorn's trio worker forwards each of ``bench/streamtool.c
client``'s streaming requests to ``streamtool upstream`` through the gateway's own upstream
transport (``new_upstream_client``), handing the body's bytes on as they come: no SSE
parsing, no JSON, no governance. Two modes:

* ``forward``: one ``http.response.body`` per upstream read (the least a pass-through
  forwarder on hypercorn does per chunk: wake on the upstream socket, read, send);
* ``read``: the same reads, the bytes sent in one message at the end.

Per mode, two runs (``--chunks`` and ``--baseline-chunks``); the server's CPU difference
divided by the chunk difference is the marginal CPU per chunk. ``forward`` minus ``read``
is what one ASGI send costs (hypercorn's message handling, h11's chunked framing, its send
lock and shielded cancel scope, trio's socket send and the run-loop pass after it).
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


def serve(port: int, mode: str, upstream_port: int) -> None:
    import gc

    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    from triogate.app import GC_THRESHOLDS

    gc.freeze()  # the collector as the gateway's worker runs it (triogate/app.py)
    gc.set_threshold(*GC_THRESHOLDS)
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.backlog = 4096
    config.accesslog = None
    trio.run(hypercorn_serve, app_factory(mode, upstream_port), config)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=512)
    p.add_argument("--rate", type=float, default=512)
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--baseline-chunks", type=int, default=10)
    p.add_argument("--interval-ms", type=float, default=50)
    p.add_argument("--serve", nargs=3, metavar=("PORT", "MODE", "UPSTREAM"),
                   help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        serve(int(a.serve[0]), a.serve[1], int(a.serve[2]))
        return 0
    tool = streams.build_tool()
    uport = procs.free_port()
    upstream = subprocess.Popen([str(tool), "upstream", str(uport), str(a.interval_ms)],
                                stdout=subprocess.DEVNULL)
    figures: dict[str, float] = {}
    for mode in ("forward", "read"):
        port = procs.free_port()
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), mode,
                                   str(uport)])
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    import socket
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            proc = psutil.Process(server.pid)
            cpu: dict[int, float] = {}
            for chunks in (a.chunks, a.baseline_chunks):
                before = sum(proc.cpu_times()[:2])
                result = streams.client(port, streams=a.streams, rate=a.rate, auth="Bearer x",
                                        model="floor", chunks=chunks, timeout_s=180)
                time.sleep(0.5)
                cpu[chunks] = sum(proc.cpu_times()[:2]) - before
                print(f"{mode:<7} {chunks:>4} chunks: ok {result['ok']}/{result['streams']} "
                      f"server CPU {cpu[chunks]:.2f} s", flush=True)
            diff = a.streams * (a.chunks - a.baseline_chunks)
            figures[mode] = (cpu[a.chunks] - cpu[a.baseline_chunks]) * 1e6 / diff
        finally:
            server.terminate()
            server.wait(30)
    upstream.terminate()
    upstream.wait(10)
    print(f"marginal CPU per chunk: forward {figures['forward']:.1f} us, read only "
          f"{figures['read']:.1f} us, so one ASGI send "
          f"{figures['forward'] - figures['read']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
