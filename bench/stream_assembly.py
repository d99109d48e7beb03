"""The response cache's part of a stream, per event and per open stream, trees alternating.

    python bench/stream_assembly.py /tmp/base-tree "$PWD" --rounds 3

What a worker whose response cache stores streamed answers does beyond forwarding, on a
raw chat stream (102 events: a role chunk, 99 content chunks, the finish and the usage
chunk) and a raw messages stream (105 events: start, a text block of 100 deltas, stop,
message_delta, message_stop), each event parsed once beforehand as ``RawStream`` does:

* a tree with ``cache.replay.assembler`` (w10): per event the assembler's ``feed`` and the
  look for the event naming the response id, then ``result()``;
* an older tree: per event its wire bytes appended to the kept list, then
  ``flow._decoded`` and ``assemble`` at the end.

``timeit``: µs per event, the min of ``--repeat`` runs of ``--number`` streams. Memory:
``--streams`` finished streams' states held at once (an older tree: the kept wire bytes,
each its own bytes object as a read hands it over; w10: the assembler and the naming
event), by ``tracemalloc`` and by the process's RSS growth. One child process per tree
and round.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import timeit
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

HEAD = {"id": "chatcmpl-streamtool", "object": "chat.completion.chunk", "created": 1700000000,
        "model": "streamtool"}


def chat_wires(chunks: int = 100) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": "w"})]
    events += [chunk({"content": " w"})] * (chunks - 1)
    events += [chunk({}, "stop"), {**HEAD, "choices": [], "usage": {
        "prompt_tokens": 10, "completion_tokens": chunks, "total_tokens": chunks + 10}}]
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events]


def messages_wires(deltas: int = 100) -> list[bytes]:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {
            "id": "msg_streamtool", "type": "message", "role": "assistant",
            "model": "streamtool", "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "text", "text": ""}}]
    events += [{"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": " w"}}] * deltas
    events += [{"type": "content_block_stop", "index": 0},
               {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                   "stop_sequence": None},
                "usage": {"output_tokens": deltas}},
               {"type": "message_stop"}]
    return [b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
            for e in events]


def parsed(wires: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(w[w.index(b"data: ") + 6 : -2]) for w in wires]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(number: int, repeat: int, streams: int) -> dict[str, Any]:
    from triogate.api.settlement import named_id
    from triogate.cache import replay

    assembler = getattr(replay, "assembler", None)
    decoded: Any = None
    if assembler is None:
        from triogate.api.flow import _decoded as decoded

    def stream_state(api: str, wires: list[bytes], events: list[dict[str, Any]]) -> Any:
        """What one stream holds at its end, before settlement."""
        if assembler is None:
            kept: list[Any] = []
            for wire in wires:
                kept.append(wire)
            return kept
        assembly = assembler(api)
        fold = assembly.feed
        naming = None
        for event in events:
            fold(event)
            if naming is None and named_id(event) is not None:
                naming = [event]
        return assembly, naming

    def finish(api: str, state: Any) -> Any:
        if assembler is None:
            return replay.assemble(api, decoded(state))  # type: ignore[arg-type]
        return state[0].result()

    out: dict[str, Any] = {"tree": "assembler" if assembler else "kept bytes"}
    for api, wires in (("chat", chat_wires()), ("messages", messages_wires())):
        events = parsed(wires)
        body = finish(api, stream_state(api, wires, events))
        assert body is not None
        out[f"{api} body"] = orjson.dumps(body).decode()

        def run(api: str = api, wires: list[bytes] = wires, events: Any = events) -> None:
            finish(api, stream_state(api, wires, events))

        best = min(timeit.repeat(run, number=number, repeat=repeat))
        out[f"{api} us/event"] = round(best / number / len(wires) * 1e6, 3)
        # Memory: ``streams`` finished states, each from its own bytes and dicts (a read's
        # bytes and a parse per event, as a stream has them).
        gc.collect()
        rss_before = rss_bytes()
        tracemalloc.start()
        held = []
        for _ in range(streams):
            own = [bytes(bytearray(w)) for w in wires]
            held.append(stream_state(api, own, parsed(own)))
        gc.collect()
        traced, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[f"{api} held MB (tracemalloc)"] = round(traced / 1e6, 1)
        out[f"{api} RSS growth MB"] = round((rss_bytes() - rss_before) / 1e6, 1)
        del held
        gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="*", type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--number", type=int, default=200, help="streams per timeit run")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--streams", type=int, default=4096, help="finished streams held at once")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(orjson.dumps(child(a.number, a.repeat, a.streams)).decode())
        return 0
    bodies: dict[str, str] = {}
    for round_ in range(a.rounds):
        for tree in a.trees:
            run = subprocess.run(
                [sys.executable, __file__, "--child", "--number", str(a.number), "--repeat",
                 str(a.repeat), "--streams", str(a.streams)],
                env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                check=True)
            result = orjson.loads(run.stdout)
            for api in ("chat", "messages"):  # every tree assembles the same bodies
                assert bodies.setdefault(api, result[f"{api} body"]) == result[f"{api} body"]
            figures = {k: v for k, v in result.items() if not k.endswith(" body")}
            print(f"round {round_ + 1} {tree}: {figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
