"""The queue of settlements that wait for an idle worker (``api/settle_later.py``): one
runs when no task has been runnable for the cushion, or at the latest after the delay;
nothing queued is lost to a full queue, a failing settlement or a cancellation.

Real clock: idleness is the run loop's, in real time (a MockClock jumps over it)."""

from __future__ import annotations

import contextvars
import itertools
import logging
from typing import TYPE_CHECKING

import trio
import trio.lowlevel

from triogate.api.settle_later import SettleLater

if TYPE_CHECKING:
    import pytest

    from triogate.api.settle_later import Settlement


class Recorder:
    """Settlements as ``SettleLater`` calls them: (name, ended_s, now_ms, trio time run)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int, float]] = []
        self.ran = trio.Event()  # set by the first settlement (waiting on it is idle)

    def settlement(self, name: str, *, fail: bool = False) -> Settlement:
        def settle(*, ended_s: float, now_ms: int) -> None:
            self.calls.append((name, ended_s, now_ms, trio.current_time()))
            self.ran.set()
            if fail:
                raise RuntimeError(f"{name} failed")
        return settle

    @property
    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def _clock() -> itertools.count[int]:
    return itertools.count(1000)


async def _busy_for(seconds: float) -> None:
    """Keep a task runnable for ``seconds``: the loop is never idle meanwhile."""
    end = trio.current_time() + seconds
    while trio.current_time() < end:
        await trio.lowlevel.checkpoint()


async def test_without_its_task_a_settlement_runs_at_once() -> None:
    clock = _clock()
    later = SettleLater(lambda: next(clock))
    seen = Recorder()
    later.defer(seen.settlement("a"), "t-a")
    assert seen.names == ["a"]
    assert seen.calls[0][2] == 1000
    assert later.deferred == 0


async def test_a_settlement_waits_until_the_worker_has_been_idle_for_the_cushion() -> None:
    clock = _clock()
    later = SettleLater(lambda: next(clock), cushion_s=0.01, max_delay_s=10)
    seen = Recorder()
    async with trio.open_nursery() as nursery:
        await nursery.start(later.run)
        started = trio.current_time()
        later.defer(seen.settlement("a"), "t-a")
        assert seen.names == []  # queued, not run in the caller
        await _busy_for(0.1)  # runnable all along: nothing settles
        assert seen.names == []
        busy_ended = trio.current_time()
        with trio.fail_after(5):
            await seen.ran.wait()
        nursery.cancel_scope.cancel()
    name, ended_s, now_ms, ran_at = seen.calls[0]
    # The request's own end and clock, not the drain's.
    assert (name, now_ms) == ("a", 1000)
    assert started <= ended_s < busy_ended
    assert ran_at >= busy_ended
    assert later.deferred == 1


async def test_a_worker_that_is_never_idle_settles_after_the_delay() -> None:
    later = SettleLater(lambda: 0, cushion_s=1.0, max_delay_s=0.05)
    seen = Recorder()
    async with trio.open_nursery() as nursery:
        await nursery.start(later.run)
        nursery.start_soon(_busy_for, 0.5)
        start = trio.current_time()
        later.defer(seen.settlement("a"), "t-a")
        later.defer(seen.settlement("b"), "t-b")
        with trio.fail_after(5):
            while not seen.calls:
                await trio.lowlevel.checkpoint()
        waited = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert seen.names == ["a", "b"]  # in order, one drain
    assert later.drains == 1
    assert 0.05 <= waited < 0.45


async def test_a_full_queue_drains_at_once() -> None:
    later = SettleLater(lambda: 0, cushion_s=10, max_delay_s=10, max_queued=3)
    seen = Recorder()
    async with trio.open_nursery() as nursery:
        await nursery.start(later.run)
        later.defer(seen.settlement("a"), "t")
        later.defer(seen.settlement("b"), "t")
        assert seen.names == []
        later.defer(seen.settlement("c"), "t")  # the third: all three, synchronously
        assert seen.names == ["a", "b", "c"]
        nursery.cancel_scope.cancel()


async def test_a_drain_and_a_cancellation_lose_nothing() -> None:
    later = SettleLater(lambda: 0, cushion_s=10, max_delay_s=10)
    seen = Recorder()
    async with trio.open_nursery() as nursery:
        await nursery.start(later.run)
        later.defer(seen.settlement("a"), "t")
        later.drain()  # what an admin request or the settler's drain does
        assert seen.names == ["a"]
        later.defer(seen.settlement("b"), "t")
        await trio.sleep(0.01)
        assert seen.names == ["a"]
        nursery.cancel_scope.cancel()  # shutdown: the task settles what is left
    assert seen.names == ["a", "b"]
    seen.calls.clear()
    later.defer(seen.settlement("c"), "t")  # its task is gone: at once
    assert seen.names == ["c"]


async def test_a_failing_settlement_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    later = SettleLater(lambda: 0, cushion_s=10, max_delay_s=10)
    seen = Recorder()
    async with trio.open_nursery() as nursery:
        await nursery.start(later.run)
        later.defer(seen.settlement("a"), "t-a")
        later.defer(seen.settlement("bad", fail=True), "t-bad")
        later.defer(seen.settlement("c"), "t-c")
        with caplog.at_level(logging.ERROR, logger="triogate.api.settle_later"):
            later.drain()
        nursery.cancel_scope.cancel()
    assert seen.names == ["a", "bad", "c"]
    (record,) = caplog.records
    assert record.trace_id == "t-bad"  # type: ignore[attr-defined]


async def test_a_settlement_runs_in_the_context_it_was_deferred_in() -> None:
    """The request's log line carries the request's id (a context variable)."""
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
    later = SettleLater(lambda: 0, cushion_s=10, max_delay_s=10)
    seen: list[str] = []

    def settle(*, ended_s: float, now_ms: int) -> None:
        seen.append(request_id.get())

    async with trio.open_nursery() as nursery:
        await nursery.start(later.run)
        token = request_id.set("req-1")
        later.defer(settle, "t")
        request_id.reset(token)
        later.drain()
        nursery.cancel_scope.cancel()
    assert seen == ["req-1"]
