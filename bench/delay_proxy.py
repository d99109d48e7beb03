"""A loopback TCP proxy that adds latency to every client→server chunk (for Redis).

    python bench/delay_proxy.py --target 127.0.0.1:6390 --delay-ms 1 [--port 0]
        [--delay-file PATH]

It prints ``127.0.0.1:PORT`` once listening, then forwards bytes both ways until killed.
With ``--delay-file``, the delay (in ms) is read from that file every 50 ms, so that one
gateway can be measured at several delays without a restart.
Each chunk read from the client leaves for the server ``--delay-ms`` after it arrived,
in order; chunks are not serialised behind each other's delays (a pipeline sent while
another is in flight is delayed by the same amount, not twice), so the proxy models a
longer wire, not a slower one. Server→client bytes pass at once: one delay per round trip.

Trio sleeps to a deadline; epoll's timeout resolution (1 ms) makes the real added delay a
little above ``--delay-ms``: load.py measures it with PINGs and reports what it saw.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from functools import partial
from pathlib import Path

import attrs
import trio

_CHUNK_BYTES = 65536
#: Chunks queued per connection before the reader waits (backpressure to the client).
_QUEUE = 1024


@attrs.define
class Delay:
    """The current delay; changed at run time by :func:`_follow`."""

    seconds: float


async def _follow(path: Path, delay: Delay) -> None:
    """Keep ``delay`` equal to the milliseconds written in ``path``."""
    source = trio.Path(path)
    while True:
        with contextlib.suppress(OSError, ValueError):  # being rewritten: keep the last
            delay.seconds = float((await source.read_text()).strip() or 0) / 1000
        await trio.sleep(0.05)


async def _client_to_server(client: trio.SocketStream, server: trio.SocketStream,
                            delay: Delay) -> None:
    send, receive = trio.open_memory_channel[tuple[float, bytes]](_QUEUE)

    async def delayed_writer() -> None:
        async with receive:
            async for due, data in receive:
                await trio.sleep_until(due)
                await server.send_all(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(delayed_writer)
        async with send:
            while data := await client.receive_some(_CHUNK_BYTES):
                await send.send((trio.current_time() + delay.seconds, data))
        # The client closed: the writer drains what is queued, then the nursery ends.


async def _server_to_client(server: trio.SocketStream, client: trio.SocketStream) -> None:
    while data := await server.receive_some(_CHUNK_BYTES):
        await client.send_all(data)


async def _handle(target: tuple[str, int], delay: Delay, client: trio.SocketStream) -> None:
    try:
        server = await trio.open_tcp_stream(*target)
    except OSError:
        await client.aclose()
        return
    with trio.CancelScope() as scope:
        async with client, server:
            try:
                async with trio.open_nursery() as nursery:
                    async def one_way(fn: object, *args: object) -> None:
                        await fn(*args)  # type: ignore[operator]
                        scope.cancel()  # either side closed: tear down both

                    nursery.start_soon(one_way, _client_to_server, client, server, delay)
                    nursery.start_soon(one_way, _server_to_client, server, client)
            except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # a peer went away mid-write: the connection is over either way


async def serve(target: tuple[str, int], delay: Delay, port: int,
                delay_file: Path | None) -> None:
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        if delay_file is not None:
            nursery.start_soon(_follow, delay_file, delay)
        print(f"127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)
        await trio.serve_listeners(partial(_handle, target, delay), listeners)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="HOST:PORT of the real server")
    parser.add_argument("--delay-ms", type=float, default=1.0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-file", type=Path,
                        help="read the delay (ms) from this file, every 50 ms")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve, (host, int(port)), Delay(args.delay_ms / 1000), args.port,
                 args.delay_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
