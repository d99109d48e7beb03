"""Instructions per forwarded chunk of a raw chat stream, exact: callgrind, trees alternating.

    python bench/stream_chunk_ir.py /tmp/base-tree "$PWD" --per-read 1 5

What one chunk costs between the upstream socket and the client write, without the
scheduler's or the host's noise: each stream's chunks are written into a socket pair
(``--per-read`` chunks per write, so that each read brings that many, as on a worker that
keeps up, 1, or is behind, 3-7), read by ``UpstreamBody.read_some`` (chunked framing,
``os.read``), parsed by ``RawStream``, forwarded by a copy of ``flow.py``'s producer loop with the
response cache storing the answer: in a tree with ``cache.replay.assembler`` (w10) each
event folded into the answer as it passes and the event naming the response id kept, in
an older tree every event's wire bytes kept and decoded and assembled at the stream's end
(``flow._decoded`` + ``cache.replay.assemble``). The child runs under
``valgrind --tool=callgrind``; Ir per chunk is the difference between ``--chunks`` and
``--baseline-chunks`` runs divided by the chunk difference (start-up cancels out).
PYTHONHASHSEED is fixed; Ir still vary by ~2 % between identical runs (allocation).
No pacer runs here (a read behind takes its extra pass on both trees).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HEAD = (b'{"id":"chatcmpl-streamtool","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"streamtool","choices":[{"index":0,"delta":')


def _groups(chunks: int, per_read: int) -> list[bytes]:
    events = [b"data: " + HEAD + b'{"role":"assistant","content":"w"},"finish_reason":null}]}'
              b"\n\n"]
    events += [b"data: " + HEAD + b'{"content":" w"},"finish_reason":null}]}\n\n'] * (chunks - 1)
    events += [b"data: " + HEAD + b'{},"finish_reason":"stop"}]}\n\n',
               b'data: {"id":"chatcmpl-streamtool","object":"chat.completion.chunk",'
               b'"created":1700000000,"model":"streamtool","choices":[],"usage":'
               b'{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}\n\n'
               % (chunks, chunks + 10), b"data: [DONE]\n\n"]
    frames = [b"%x\r\n%b\r\n" % (len(e), e) for e in events]
    groups = [b"".join(frames[i : i + per_read]) for i in range(0, len(frames), per_read)]
    groups[-1] += b"0\r\n\r\n"
    return groups


def child(streams: int, chunks: int, per_read: int) -> None:
    import trio

    from triogate.api.settlement import named_id
    from triogate.providers.http1 import UpstreamBody, UpstreamConnection
    from triogate.providers.rawsse import CHAT, RawStream
    from triogate.providers.translate import ChatPassthrough
    from triogate.providers.usage import ChatUsageTracker

    try:  # a tree whose producer folds each event into the answer as it passes (w10)
        from triogate.cache.replay import assembler
        decoded: Any = None
    except ImportError:  # before: every event's wire bytes kept, decoded again at the end
        from triogate.api.flow import _decoded as decoded
        from triogate.cache.replay import assemble

    groups = _groups(chunks, per_read)

    class Pool:
        async def release(self, conn: Any, *, reuse: bool) -> None:
            pass

    async def one(pool: Pool) -> None:
        ours, peer = socket.socketpair()
        sock = trio.socket.from_stdlib_socket(ours)
        conn = UpstreamConnection((b"http", b"x", 80), trio.SocketStream(sock), sock)
        body = UpstreamBody(pool, conn, None, length=None, chunked=True, keep_alive=True,
                            read_timeout=60)
        stream = RawStream(body.read_some, ChatUsageTracker(input_tokens=10),
                           ChatPassthrough(created_s=1), CHAT)
        pending = iter(groups)
        kept: list[Any] = []
        assembly = assembler("chat") if decoded is None else None
        fold = assembly.feed if assembly is not None else None
        naming: Any = None
        receive = stream.__anext__
        peer.send(next(pending))
        event: Any = await receive()
        wire = stream.wire
        while event is not None:  # flow.py's producer, the client write left out
            burst = []
            while event is not None:
                if decoded is not None:
                    kept.append(event if wire is None else wire)
                else:
                    if fold is not None:
                        fold(event)
                    if naming is None and named_id(event) is not None:
                        naming = [event]
                burst.append(wire)
                event = stream.next_nowait()
                wire = stream.wire
            b"".join(burst)
            if (more := next(pending, None)) is not None:
                peer.send(more)
            try:
                event = await receive()
            except StopAsyncIteration:
                event = None
            wire = stream.wire
        if assembly is not None:
            assert assembly.result() is not None and naming is not None
        else:
            assert assemble("chat", decoded(kept)) is not None
        await body.aclose()
        peer.close()
        sock.close()

    async def main() -> None:
        pool = Pool()
        for _ in range(streams):
            await one(pool)

    trio.run(main)


def instructions(tree: Path, streams: int, chunks: int, per_read: int) -> int:
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "cg.out"
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                              sys.executable, __file__, "--child", str(streams), str(chunks),
                              str(per_read)], env=env, capture_output=True, text=True,
                             check=True, timeout=1800)
        found = re.search(r"Collected : (\d+)", run.stderr)
        assert found is not None, run.stderr[-2000:]
        return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="*", type=Path)
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--baseline-chunks", type=int, default=10)
    p.add_argument("--per-read", type=int, nargs="+", default=[1, 5])
    p.add_argument("--child", type=int, nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(*a.child)
        return 0
    for per_read in a.per_read:
        for tree in a.trees:
            full = instructions(tree, a.streams, a.chunks, per_read)
            base = instructions(tree, a.streams, a.baseline_chunks, per_read)
            per_chunk = (full - base) / (a.streams * (a.chunks - a.baseline_chunks))
            print(f"{tree} {per_read} chunks per read: {per_chunk:,.0f} Ir per chunk",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
