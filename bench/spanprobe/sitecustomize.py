"""Put on a gateway's PYTHONPATH by ``bench/tail_spans.py``: what runs on the critical
path of a one-connection request (issue 13, goal 4).

It wraps, in the worker only: the ASGI call (a request's start), ``admission.admit`` (the
end of its pre-call work), ``Settler._flush`` (post-call group commits) and
``trio.to_thread.run_sync`` (worker-thread jobs), and times every collector pass
(``gc.callbacks``). Every 5 s it writes one JSON line to stderr, prefixed ``spanprobe``:

* ``gc``: per generation, passes, their milliseconds, a histogram of their durations,
  and the objects they collected;
* ``flush``: settler flushes, how many started while a request was in its pre-call
  work, the milliseconds of those overlaps, and the delay from the previous response
  to the flush's start;
* ``thread``: worker-thread jobs and their milliseconds;
* ``latency``: per set of what a request overlapped (``gc``: a collector pass ran while
  it was served; ``thread``: a worker-thread job; ``flush``: a settler flush during its
  pre-call work; ``-``: none), a histogram of the requests' latencies in the worker
  (:data:`LATENCY_MS` buckets): which of them make the tail.

With ``SPANPROBE_SAVEALL=1`` the collector keeps what it finds (``gc.DEBUG_SAVEALL``) and
each line also counts the types of the objects found in reference cycles (``cycles``).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from typing import Any

BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 1e9)
LATENCY_MS = (22, 23, 24, 25, 26, 28, 30, 35, 40, 60, 1e9)


def _hist() -> list[int]:
    return [0] * len(BUCKETS_MS)


def _add(hist: list[int], ms: float, buckets: tuple[float, ...] = BUCKETS_MS) -> None:
    for i, bound in enumerate(buckets):
        if ms <= bound:
            hist[i] += 1
            return


def install() -> None:
    import trio

    import triogate.api.admission as admission
    import triogate.api.asgi as asgi
    from triogate.batch import _settler

    stats: dict[str, Any] = {
        "gc": {g: [0, 0.0, _hist(), 0] for g in (0, 1, 2)},  # passes, ms, hist, collected
        "flush": {"n": 0, "in_precall": 0, "overlap_ms": 0.0, "flush_ms": 0.0,
                  "since_response_ms": _hist(), "flush_ms_hist": _hist()},
        "thread": {"n": 0, "ms": 0.0, "hist": _hist()},
        "requests": 0,
        "latency": {},
        "cycles": {},
    }
    state: dict[str, Any] = {"precall_start": None, "last_response": 0.0, "gc_start": 0.0,
                             "flags": None, "threads": 0}
    saveall = os.environ.get("SPANPROBE_SAVEALL") == "1"
    if saveall:
        gc.set_debug(gc.DEBUG_SAVEALL)

    def flag(name: str) -> None:
        if state["flags"] is not None:
            state["flags"].add(name)
    lock = threading.Lock()

    def gc_pass(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if saveall:  # what the pass is about to walk
                young = stats.setdefault("young", {})
                for obj in gc.get_objects(generation=info["generation"]):
                    name = type(obj).__qualname__
                    young[name] = young.get(name, 0) + 1
            state["gc_start"] = time.perf_counter()
            return
        ms = (time.perf_counter() - state["gc_start"]) * 1000
        with lock:
            entry = stats["gc"][info["generation"]]
            entry[0] += 1
            entry[1] += ms
            _add(entry[2], ms)
            entry[3] += info["collected"]
        flag("gc")
        if saveall and gc.garbage:
            cycles = stats["cycles"]
            for obj in gc.garbage:
                name = type(obj).__qualname__
                cycles[name] = cycles.get(name, 0) + 1
            gc.garbage.clear()

    gc.callbacks.append(gc_pass)

    call = asgi.GatewayASGI.__call__

    async def traced_call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("path", "").startswith("/v1/"):
            start = state["precall_start"] = time.perf_counter()
            stats["requests"] += 1
            flags = state["flags"] = {"thread"} if state["threads"] else set()
            try:
                await call(self, scope, receive, send)
            finally:
                state["precall_start"] = None
                end = state["last_response"] = time.perf_counter()
                state["flags"] = None
                key = "+".join(sorted(flags)) or "-"
                hist = stats["latency"].setdefault(key, [0] * len(LATENCY_MS))
                _add(hist, (end - start) * 1000, LATENCY_MS)
        else:
            await call(self, scope, receive, send)

    asgi.GatewayASGI.__call__ = traced_call  # type: ignore[method-assign]

    admit = admission.admit

    async def traced_admit(*args: Any, **kwargs: Any) -> Any:
        try:
            return await admit(*args, **kwargs)
        finally:
            state["precall_start"] = None

    admission.admit = traced_admit  # type: ignore[assignment]

    flush = _settler.Settler._flush

    async def traced_flush(self: Any, batches: Any) -> None:
        start = time.perf_counter()
        f = stats["flush"]
        f["n"] += 1
        _add(f["since_response_ms"], (start - state["last_response"]) * 1000)
        precall_before = state["precall_start"]
        try:
            await flush(self, batches)
        finally:
            end = time.perf_counter()
            ms = (end - start) * 1000
            f["flush_ms"] += ms
            _add(f["flush_ms_hist"], ms)
            precall = state["precall_start"] or precall_before
            if precall is not None:
                flag("flush")
                f["in_precall"] += 1
                f["overlap_ms"] += (end - max(start, precall)) * 1000

    _settler.Settler._flush = traced_flush  # type: ignore[method-assign]

    run_sync = trio.to_thread.run_sync

    async def traced_run_sync(fn: Any, *args: Any, **kwargs: Any) -> Any:
        def timed(*a: Any) -> Any:
            t0 = time.perf_counter()
            state["threads"] += 1
            flag("thread")
            try:
                return fn(*a)
            finally:
                state["threads"] -= 1
                ms = (time.perf_counter() - t0) * 1000
                with lock:
                    stats["thread"]["n"] += 1
                    stats["thread"]["ms"] += ms
                    _add(stats["thread"]["hist"], ms)
        return await run_sync(timed, *args, **kwargs)

    trio.to_thread.run_sync = traced_run_sync  # type: ignore[assignment]

    def report() -> None:
        while True:
            time.sleep(5)
            try:
                with lock:
                    line = json.dumps(stats, default=float)
            except RuntimeError:  # a dict grew under json (the loop's thread): next time
                continue
            sys.stderr.write(f"spanprobe {line}\n")
            sys.stderr.flush()

    threading.Thread(target=report, daemon=True, name="spanprobe").start()


# Only in a worker (``serve`` in its arguments) whose harness asked for it.
if "serve" in sys.argv and os.environ.get("SPANPROBE") == "1":
    install()
