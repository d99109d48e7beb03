"""Post-call batches and the settler, on MockClock with a recording backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import (
    BackendUnavailable,
    BatchClosed,
    Journal,
    MemoryTracer,
    Settler,
    open_post_call_batch,
    post_call_batch,
)
from triogate.batch.testing import FaultyBackend, RecordingBackend

if TYPE_CHECKING:
    from pathlib import Path

    from trio.testing import MockClock


async def test_the_deadline_closes_the_batch_at_exactly_one_second(
    autojump_clock: MockClock,
) -> None:
    backend = RecordingBackend()
    settler = Settler({"default": backend})
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        async with open_post_call_batch(settler, trace_id="r1") as post:
            post.call("INCRBY", keys=["spend"], args=[5], owner="budgets")
            await trio.sleep_forever()  # a callback that never finishes
        assert trio.current_time() == 1.0
        await post.wait_settled()
        nursery.cancel_scope.cancel()
    assert backend.commands == ["INCRBY"]
    with pytest.raises(BatchClosed):
        post.call("GET", keys=["x"], owner="late")


async def test_settlement_survives_cancellation_of_the_request(autojump_clock: MockClock) -> None:
    backend = RecordingBackend()
    settler = Settler({"default": backend})
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        with trio.CancelScope() as request:
            request.cancel()  # the client is gone
            async with open_post_call_batch(settler, trace_id="r1") as post:
                await trio.sleep(0.1)  # shielded: the callbacks still run
                post.call("INCRBY", keys=["spend"], args=[5], owner="budgets")
        await settler.wait_drained()
        nursery.cancel_scope.cancel()
    assert backend.commands == ["INCRBY"]


async def test_batches_closing_during_a_flush_leave_together(autojump_clock: MockClock) -> None:
    backend = RecordingBackend(delay_s=1)
    tracer = MemoryTracer()
    settler = Settler({"default": backend}, tracer=tracer)

    async def request(i: int) -> None:
        async with open_post_call_batch(settler, trace_id=f"r{i}") as post:
            post.call("INCRBY", keys=[f"k{i}"], args=[1], owner="budgets")

    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        await request(0)
        await trio.sleep(0.5)  # r0's flush is on the wire
        for i in range(1, 4):
            await request(i)
        await settler.wait_drained()
        nursery.cancel_scope.cancel()
    assert [len(p) for p in backend.pipelines] == [1, 3]
    stats = settler.statistics()
    assert (stats.flushes, stats.batches, stats.commands) == (2, 4, 4)
    for i in range(4):
        summary = tracer.summary(f"r{i}")
        assert (summary.waits_before, summary.waits_after) == (0, 1)
    assert tracer.records("r2")[0].shared_with == 3


async def test_shutdown_drains_pending_batches(autojump_clock: MockClock) -> None:
    backend = RecordingBackend(delay_s=0.2)
    settler = Settler({"default": backend})
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        for i in range(5):
            async with open_post_call_batch(settler, trace_id=f"r{i}") as post:
                post.call("INCRBY", keys=[f"k{i}"], args=[1], owner="budgets")
        assert settler.statistics().queued + settler.statistics().in_flight > 0
        with trio.fail_after(10):
            await settler.wait_drained()
        nursery.cancel_scope.cancel()
    assert sorted(c[1] for p in backend.pipelines for c in p) == [f"k{i}" for i in range(5)]
    assert settler.statistics().queued == 0


async def test_a_failed_flush_is_journaled_and_replayed(
    file_clock: MockClock, tmp_path: Path
) -> None:
    inner = RecordingBackend()
    backend = FaultyBackend(inner)
    backend.down = True
    settler = Settler({"default": backend}, journal=Journal(tmp_path), replay_interval_s=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        async with open_post_call_batch(settler, trace_id="r1") as post:
            handle = post.call("INCRBY", keys=["spend"], args=[7], owner="budgets")
        await settler.wait_drained()
        with pytest.raises(BackendUnavailable):
            await handle
        assert settler.statistics().journal_pending == 1
        journal = trio.Path(next(iter(tmp_path.glob("journal-*.jsonl"))))
        assert (await journal.read_bytes()).count(b"\n") == 1
        backend.down = False
        await trio.sleep(1.5)  # the next replay attempt
        assert settler.statistics().journal_pending == 0
        assert settler.statistics().replayed == 1
        nursery.cancel_scope.cancel()
    assert inner.pipelines == [[("INCRBY", "spend", 7)]]
    assert not list(tmp_path.glob("journal-*"))  # nothing left on a clean exit


async def test_cancelling_the_settler_journals_what_was_queued(
    file_clock: MockClock, tmp_path: Path
) -> None:
    backend = RecordingBackend(delay_s=5)
    settler = Settler({"default": backend}, journal=Journal(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        for i in range(3):
            async with open_post_call_batch(settler, trace_id=f"r{i}") as post:
                post.call("INCRBY", keys=[f"k{i}"], args=[1], owner="budgets")
        await trio.sleep(1)
        nursery.cancel_scope.cancel()  # no drain: a crash path
    assert settler.statistics().journaled == 3
    # The next process claims the orphaned journal.
    successor = Journal(tmp_path)
    assert await successor.open() == 3
    assert sorted(e.trace_id for e in successor.pending) == ["r0", "r1", "r2"]
    successor.close()


async def test_a_sync_post_call_batch_leaves_with_the_next_flush(
    autojump_clock: MockClock,
) -> None:
    """``post_call_batch``: the same hand-off as the async form (group commit included),
    and closed after the block."""
    backend = RecordingBackend(delay_s=1)
    tracer = MemoryTracer()
    settler = Settler({"default": backend}, tracer=tracer)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        with post_call_batch(settler, trace_id="r1") as first:
            first.call("INCRBY", keys=["spend"], args=[5], owner="budgets")
        with post_call_batch(settler, trace_id="r2") as second:
            second.call("INCRBY", keys=["spend"], args=[7], owner="budgets")
        await first.wait_settled()
        await second.wait_settled()
        nursery.cancel_scope.cancel()
    assert backend.commands == ["INCRBY", "INCRBY"]
    assert [len(p) for p in backend.pipelines] == [2]  # group commit, as the async form
    assert first.rounds == second.rounds == 1
    with pytest.raises(BatchClosed):
        second.call("GET", keys=["x"], owner="late")


async def test_a_sync_post_call_batch_hands_off_on_error(autojump_clock: MockClock) -> None:
    backend = RecordingBackend()
    settler = Settler({"default": backend})
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        with pytest.raises(KeyError), post_call_batch(settler, trace_id="r1") as post:
            post.call("INCRBY", keys=["spend"], args=[5], owner="budgets")
            raise KeyError("a callback's bug")
        await post.wait_settled()
        nursery.cancel_scope.cancel()
    assert backend.commands == ["INCRBY"]


async def test_a_group_commit_is_bounded_by_its_commands(autojump_clock: MockClock) -> None:
    """Batches queued during a flush leave in group commits of at most
    ``max_commands_per_flush`` commands (one batch at least), in order."""
    backend = RecordingBackend(delay_s=1)
    settler = Settler({"default": backend}, max_commands_per_flush=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        for i, size in enumerate((1, 2, 2, 2, 7, 1)):
            with post_call_batch(settler, trace_id=f"r{i}") as post:
                for j in range(size):
                    post.call("INCRBY", keys=[f"k{i}"], args=[j], owner="budgets")
        await settler.wait_drained()
        nursery.cancel_scope.cancel()
    # 1+2+2 = 5; then 2 (2+7 would be 9); then 7 alone (over the bound, but one batch
    # always leaves); then 1.
    assert [len(p) for p in backend.pipelines] == [5, 2, 7, 1]
    assert settler.statistics().batches == 6


async def test_a_flush_leaves_after_the_group_commit_delay(autojump_clock: MockClock) -> None:
    backend = RecordingBackend()
    settler = Settler({"default": backend}, delay_s=0.005)
    sent_at: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        with post_call_batch(settler, trace_id="r0") as post:
            post.call("INCRBY", keys=["k0"], args=[1], owner="budgets")
        await trio.sleep(0.002)
        with post_call_batch(settler, trace_id="r1") as post1:
            post1.call("INCRBY", keys=["k1"], args=[1], owner="budgets")
        await post.wait_settled()
        sent_at.append(trio.current_time())
        await post1.wait_settled()
        nursery.cancel_scope.cancel()
    # Not as r0 closed (its response just left): 5 ms later, r1 with it.
    assert sent_at == [pytest.approx(0.005)]
    assert [len(p) for p in backend.pipelines] == [2]


async def test_a_queued_batch_does_not_wake_the_settler_before_its_delay(
    autojump_clock: MockClock,
) -> None:
    """Woken at submission, the settler would only start the delay and sleep again: a
    loop pass per flush (per request at one connection). It first runs when the delay is
    over, and flushes then; a drain still wakes it at once."""
    backend = RecordingBackend()
    settler = Settler({"default": backend}, delay_s=0.005)
    steps: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        await trio.sleep(1)
        task = next(t for t in nursery.child_tasks if "run" in t.name)

        class Steps(trio.abc.Instrument):
            def before_task_step(self, stepped: trio.lowlevel.Task) -> None:
                if stepped is task:
                    steps.append(trio.current_time())

        trio.lowlevel.add_instrument(Steps())
        with post_call_batch(settler, trace_id="r0") as post:
            post.call("INCRBY", keys=["k0"], args=[1], owner="budgets")
        await post.wait_settled()
        assert steps and min(steps) == pytest.approx(1.005)
        assert trio.current_time() == pytest.approx(1.005)
        with post_call_batch(settler, trace_id="r1") as post:
            post.call("INCRBY", keys=["k1"], args=[1], owner="budgets")
        await trio.sleep(0.001)
        await settler.wait_drained()
        assert trio.current_time() == pytest.approx(1.006)  # not at the end of the delay
        nursery.cancel_scope.cancel()
    assert [len(p) for p in backend.pipelines] == [1, 1]


async def test_a_hurried_batch_leaves_at_once_with_those_before_it(
    autojump_clock: MockClock,
) -> None:
    backend = RecordingBackend()
    settler = Settler({"default": backend}, delay_s=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        with post_call_batch(settler, trace_id="r0") as post0:
            post0.call("INCRBY", keys=["k0"], args=[1], owner="budgets")
        with post_call_batch(settler, trace_id="r1") as post1:
            post1.call("INCRBY", keys=["k1"], args=[-1], owner="rate_limits")
            post1.hurry()  # e.g. it gives back a parallel slot
        await post1.wait_settled()
        await post0.wait_settled()
        assert trio.current_time() == 0
        # The next batch waits for the delay again.
        with post_call_batch(settler, trace_id="r2") as post2:
            post2.call("INCRBY", keys=["k2"], args=[1], owner="budgets")
        await post2.wait_settled()
        assert trio.current_time() == 10
        nursery.cancel_scope.cancel()
    assert [len(p) for p in backend.pipelines] == [2, 1]


async def test_the_delay_bounds_the_oldest_batch_under_steady_load(
    autojump_clock: MockClock,
) -> None:
    backend = RecordingBackend(delay_s=0.001)
    settler = Settler({"default": backend}, delay_s=0.005)
    waits: list[float] = []

    async def request(i: int) -> None:
        with post_call_batch(settler, trace_id=f"r{i}") as post:
            post.call("INCRBY", keys=[f"k{i}"], args=[1], owner="budgets")
        closed = trio.current_time()
        await post.wait_settled()
        waits.append(trio.current_time() - closed)

    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        async with trio.open_nursery() as clients:
            for i in range(40):
                clients.start_soon(request, i)
                await trio.sleep(0.0005)
        nursery.cancel_scope.cancel()
    # Settled within the delay plus a flush or two (batches queued during one leave
    # with the next), and many share each flush.
    assert max(waits) <= 0.005 + 2 * 0.001 + 1e-9
    assert settler.statistics().flushes <= 8


async def test_a_full_queue_does_not_wait_for_the_delay(autojump_clock: MockClock) -> None:
    backend = RecordingBackend()
    settler = Settler({"default": backend}, delay_s=10, max_batches_per_flush=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        posts = []
        for i in range(3):
            with post_call_batch(settler, trace_id=f"r{i}") as post:
                post.call("INCRBY", keys=[f"k{i}"], args=[1], owner="budgets")
            posts.append(post)
        for post in posts:
            await post.wait_settled()
        assert trio.current_time() == 0
        nursery.cancel_scope.cancel()
    assert [len(p) for p in backend.pipelines] == [3]


async def test_draining_does_not_wait_for_the_delay(autojump_clock: MockClock) -> None:
    backend = RecordingBackend()
    settler = Settler({"default": backend}, delay_s=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        with post_call_batch(settler, trace_id="r0") as post:
            post.call("INCRBY", keys=["k0"], args=[1], owner="budgets")
        await settler.wait_drained()
        assert trio.current_time() == 0
        # After the drain, the delay holds again.
        with post_call_batch(settler, trace_id="r1") as post:
            post.call("INCRBY", keys=["k1"], args=[1], owner="budgets")
        await post.wait_settled()
        assert trio.current_time() == 10
        nursery.cancel_scope.cancel()
    assert backend.commands == ["INCRBY", "INCRBY"]


async def test_cancelling_the_settler_in_its_delay_journals_what_was_queued(
    file_clock: MockClock, tmp_path: Path,
) -> None:
    settler = Settler({"default": RecordingBackend()}, journal=Journal(tmp_path / "j"),
                      delay_s=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        with post_call_batch(settler, trace_id="r0") as post:
            post.call("INCRBY", keys=["k0"], args=[1], owner="budgets")
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    await post.wait_settled()
    assert settler.statistics().journaled == 1


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay_s"):
        Settler({"default": RecordingBackend()}, delay_s=-1)


async def test_a_due_flush_waits_while_busy(autojump_clock: MockClock) -> None:
    backend = RecordingBackend()
    busy_until = [0.007]  # a request's pre-call checks outlast the 5 ms delay
    settler = Settler({"default": backend}, delay_s=0.005,
                      busy=lambda: trio.current_time() < busy_until[0])
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        with post_call_batch(settler, trace_id="r0") as post:
            post.call("INCRBY", keys=["k0"], args=[1], owner="budgets")
        await post.wait_settled()
        # Due at 5 ms, busy: on in steps of half the delay, free at 7.5 ms.
        assert trio.current_time() == pytest.approx(0.0075)
        busy_until[0] = float("inf")  # always busy: bounded at four delays
        start = trio.current_time()
        with post_call_batch(settler, trace_id="r1") as post:
            post.call("INCRBY", keys=["k1"], args=[1], owner="budgets")
        await post.wait_settled()
        assert trio.current_time() - start == pytest.approx(0.020)
        # Draining does not wait for busy either.
        with post_call_batch(settler, trace_id="r2") as post:
            post.call("INCRBY", keys=["k2"], args=[1], owner="budgets")
        start = trio.current_time()
        await settler.wait_drained()
        assert trio.current_time() == start
        nursery.cancel_scope.cancel()
    assert len(backend.pipelines) == 3
