"""What hypercorn's per-send path costs: the floor under the gateway's CPU per stream chunk.

    python bench/send_floor.py --streams 512 --rate 512

A bare ASGI app on hypercorn's trio worker (no gateway code, no upstream) answers each of
``bench/streamtool.c client``'s streaming requests with ``max_tokens`` chat chunks
``--interval-ms`` apart plus finish, usage and [DONE], in one of two modes:

* ``send``: one ``http.response.body`` per chunk, after a ``trio.sleep`` (what a
  forwarder does at least: wake up, send);
* ``sleep``: the same wake-ups, but the chunks go out in one send at the end.

Per mode, two runs (``--chunks`` and ``--baseline-chunks``); the server's CPU difference
divided by the chunk difference is the marginal CPU per chunk. ``send`` minus ``sleep`` is
what one ASGI send costs (hypercorn's message handling, h11 framing, its send lock and
shielded cancel scope, trio's socket send); ``sleep`` is a timer wake-up of a task parked
in hypercorn's request handler.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import load_procs as procs  # noqa: E402
import streams  # noqa: E402

_HEAD = (b'{"id":"chatcmpl-floor","object":"chat.completion.chunk","created":1700000000,'
         b'"model":"floor","choices":[{"index":0,"delta":')


def _event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def app_factory(mode: str, interval_s: float) -> Any:
    import trio

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        chunks = int(orjson.loads(body).get("max_tokens", 1))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        held: list[bytes] = []
        for i in range(chunks):
            if i:
                await trio.sleep(interval_s)
            content = b'{"content":" w"},"finish_reason":null}]}'
            chunk = _event(_HEAD + content)
            if mode == "send":
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            else:
                held.append(chunk)
        tail = (_event(_HEAD + b'{},"finish_reason":"stop"}]}')
                + _event(b'{"id":"chatcmpl-floor","choices":[],"usage":{"prompt_tokens":10,'
                         b'"completion_tokens":%d,"total_tokens":%d}}' % (chunks, chunks + 10))
                + b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"".join(held) + tail,
                    "more_body": False})

    return app


def serve(port: int, mode: str, interval_s: float) -> None:
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.backlog = 4096
    config.accesslog = None
    trio.run(hypercorn_serve, app_factory(mode, interval_s), config)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=512)
    p.add_argument("--rate", type=float, default=512)
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--baseline-chunks", type=int, default=10)
    p.add_argument("--interval-ms", type=float, default=50)
    p.add_argument("--serve", nargs=2, metavar=("PORT", "MODE"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        serve(int(a.serve[0]), a.serve[1], a.interval_ms / 1000)
        return 0
    streams.build_tool()
    figures: dict[str, float] = {}
    for mode in ("send", "sleep"):
        port = procs.free_port()
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), mode,
                                   "--interval-ms", str(a.interval_ms)])
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
                print(f"{mode:<5} {chunks:>4} chunks: ok {result['ok']}/{result['streams']} "
                      f"server CPU {cpu[chunks]:.2f} s", flush=True)
            diff = a.streams * (a.chunks - a.baseline_chunks)
            figures[mode] = (cpu[a.chunks] - cpu[a.baseline_chunks]) * 1e6 / diff
        finally:
            server.terminate()
            server.wait(30)
    print(f"marginal CPU per chunk: send {figures['send']:.1f} us, sleep only "
          f"{figures['sleep']:.1f} us, so one ASGI send {figures['send'] - figures['sleep']:.1f}"
          " us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
