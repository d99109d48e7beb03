"""The batch scope's flush rule, on MockClock with a recording backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
import trio.lowlevel
import trio.testing

from triogate.batch import (
    BackendUnavailable,
    Batch,
    BatchClosed,
    CommandError,
    MemoryTracer,
    Script,
    open_batch_scope,
)
from triogate.batch.testing import FaultyBackend, RecordingBackend

if TYPE_CHECKING:
    from trio.testing import MockClock

    from triogate.batch import BatchScope, Participant


async def get_and_wait(batch: Batch, owner: str) -> object:
    return await batch.call("GET", keys=[f"k:{owner}"], owner=owner)


async def test_three_participants_share_one_round(autojump_clock: MockClock) -> None:
    backend = RecordingBackend({"GET": b"1"})
    async with open_batch_scope({"default": backend}) as scope:
        ps = [
            scope.start_participant(get_and_wait, scope.batch, owner, name=owner)
            for owner in ("auth", "budgets", "rate_limits")
        ]
    assert [len(p) for p in backend.pipelines] == [3]
    assert scope.statistics().rounds == 1
    assert [p.result() for p in ps] == [b"1", b"1", b"1"]


async def test_dependent_participant_lands_in_round_two(autojump_clock: MockClock) -> None:
    backend = RecordingBackend({"GET": b"id"})

    async def auth(batch: Batch) -> object:
        return await batch.call("GET", keys=["identity"], owner="auth")

    async def rate_limits(batch: Batch, who: Participant[object]) -> object:
        identity = await who.wait()
        return await batch.call("INCR", keys=[f"rl:{identity!r}"], owner="rate_limits")

    async def cache(batch: Batch) -> object:
        await trio.sleep(0.5)  # busy with something else: holds round 1 back
        return await batch.call("GET", keys=["cache"], owner="cache")

    async with open_batch_scope({"default": backend}) as scope:
        who = scope.start_participant(auth, scope.batch, name="auth")
        scope.start_participant(rate_limits, scope.batch, who, name="rate_limits")
        scope.start_participant(cache, scope.batch, name="cache")
    assert [[c[0] for c in p] for p in backend.pipelines] == [["GET", "GET"], ["INCR"]]
    assert scope.statistics().rounds == 2


async def test_declaring_after_a_flush_lands_in_the_next_round(autojump_clock: MockClock) -> None:
    backend = RecordingBackend()
    seq = trio.testing.Sequencer()

    async def early(batch: Batch) -> None:
        async with seq(0):
            handle = batch.call("GET", keys=["a"], owner="early")
        await handle

    async def late(batch: Batch) -> None:
        async with seq(1):
            first = batch.call("GET", keys=["b0"], owner="late")
        await first  # both now wait: round 1 leaves with a and b0
        async with seq(2):
            second = batch.call("GET", keys=["b1"], owner="late")
        await second

    async with open_batch_scope({"default": backend}) as scope:
        scope.start_participant(early, scope.batch)
        scope.start_participant(late, scope.batch)
    assert [[c[1] for c in p] for p in backend.pipelines] == [["a", "b0"], ["b1"]]
    assert scope.statistics().rounds == 2


async def test_declaring_while_a_flush_is_in_flight_waits_for_the_next_round(
    autojump_clock: MockClock,
) -> None:
    backend = RecordingBackend(delay_s=1)
    async with open_batch_scope({"default": backend}) as scope:
        scope.start_participant(get_and_wait, scope.batch, "first")
        await trio.sleep(0.5)  # round 1 is on the wire now
        await scope.batch.call("GET", keys=["late"], owner="late")
        assert trio.current_time() == 2  # it left after round 1 came back
    assert [[c[1] for c in p] for p in backend.pipelines] == [["k:first"], ["late"]]


async def test_a_participant_started_after_a_flush_is_in_the_next_round(
    autojump_clock: MockClock,
) -> None:
    backend = RecordingBackend()

    async def first(batch: Batch) -> None:
        await batch.call("GET", keys=["a"], owner="first")

    async with open_batch_scope({"default": backend}) as scope:
        p = scope.start_participant(first, scope.batch)
        await p.wait()  # the body waits: round 1 left with "a"
        scope.start_participant(first, scope.batch)
    assert [[c[1] for c in p] for p in backend.pipelines] == [["a"], ["a"]]
    assert scope.statistics().rounds == 2


async def test_the_body_can_await_a_handle_directly(autojump_clock: MockClock) -> None:
    backend = RecordingBackend({"GET": b"v"})
    async with open_batch_scope({"default": backend}) as scope:
        h1 = scope.batch.call("GET", keys=["a"], owner="body")
        h2 = scope.batch.call("GET", keys=["b"], owner="body")
        assert await h1 == b"v"
        assert h2.done
    assert len(backend.pipelines) == 1


async def test_an_error_reply_fails_only_its_owner(autojump_clock: MockClock) -> None:
    def respond(wire: tuple[object, ...]) -> object:
        return CommandError("WRONGTYPE nope") if wire[1] == "bad" else b"ok"

    backend = RecordingBackend(respond=respond)
    async with open_batch_scope({"default": backend}) as scope:
        good = scope.batch.call("GET", keys=["good"], owner="a")
        bad = scope.batch.call("GET", keys=["bad"], owner="b")
        assert await good == b"ok"
        with pytest.raises(CommandError, match="WRONGTYPE"):
            await bad


async def test_noscript_is_retried_with_eval_for_its_owner_alone(
    autojump_clock: MockClock,
) -> None:
    script = Script.from_source("answer", "return 42")
    backend = RecordingBackend(
        respond=lambda w: 42 if w[0] in ("EVAL", "EVALSHA") else b"plain",
        scripts_loaded=False,
        delay_s=1.0,
    )
    resumed: dict[str, float] = {}

    async def plain(batch: Batch) -> None:
        await batch.call("GET", keys=["x"], owner="plain")
        resumed["plain"] = trio.current_time()

    async def scripted(batch: Batch) -> None:
        assert await batch.call(script, keys=["y"], args=[1], owner="scripted") == 42
        resumed["scripted"] = trio.current_time()

    tracer = MemoryTracer()
    async with open_batch_scope({"default": backend}, tracer=tracer, trace_id="r") as scope:
        scope.start_participant(plain, scope.batch)
        scope.start_participant(scripted, scope.batch)
    assert [sorted(c[0] for c in p) for p in backend.pipelines] == [["EVALSHA", "GET"], ["EVAL"]]
    assert resumed == {"plain": 1.0, "scripted": 2.0}  # the others did not wait for the retry
    assert [r.retry for r in tracer.records("r")] == [False, True]
    assert scope.statistics().rounds == 1


async def test_a_failed_pipeline_fails_every_owner_with_its_own_error(
    autojump_clock: MockClock,
) -> None:
    backend = FaultyBackend(RecordingBackend())
    backend.down = True
    async with open_batch_scope({"default": backend}) as scope:
        ps = [scope.start_participant(get_and_wait, scope.batch, o) for o in ("a", "b")]
    errors = []
    for p in ps:
        with pytest.raises(BackendUnavailable) as info:
            p.result()
        errors.append(info.value)
    assert errors[0] is not errors[1]


async def test_a_participant_that_raises_does_not_hang_the_others(
    autojump_clock: MockClock,
) -> None:
    backend = RecordingBackend({"GET": b"1"})

    async def broken(batch: Batch) -> None:
        raise KeyError("bug")

    async with open_batch_scope({"default": backend}) as scope:
        bad = scope.start_participant(broken, scope.batch)
        good = scope.start_participant(get_and_wait, scope.batch, "good")
    assert good.result() == b"1"
    with pytest.raises(KeyError):
        bad.result()


async def test_cancelling_mid_flush_leaves_nothing_dangling(autojump_clock: MockClock) -> None:
    backend = RecordingBackend(delay_s=10)
    handles = []

    async def waits(batch: Batch) -> None:
        handle = batch.call("GET", keys=["k"], owner="w")
        handles.append(handle)
        await handle

    with trio.move_on_after(1):
        async with open_batch_scope({"default": backend}) as scope:
            scope.start_participant(waits, scope.batch)
            scope.start_participant(waits, scope.batch)
    assert trio.current_time() == 1
    assert all(h.done for h in handles)
    for h in handles:
        with pytest.raises(BackendUnavailable):
            h.result()
    with pytest.raises(BatchClosed):
        scope.batch.call("GET", keys=["k"], owner="late")


async def test_two_backends_leave_concurrently_in_one_round(autojump_clock: MockClock) -> None:
    counters = RecordingBackend(name="counters", delay_s=1)
    cache = RecordingBackend(name="cache", delay_s=1)
    tracer = MemoryTracer()
    async with open_batch_scope(
        {"counters": counters, "cache": cache}, tracer=tracer, trace_id="t"
    ) as scope:
        a = scope.batch.call("GET", keys=["a"], backend="counters", owner="a")
        b = scope.batch.call("GET", keys=["b"], backend="cache", owner="b")
        await a
        await b
    assert trio.current_time() == 1
    assert tracer.summary("t").waits_before == 1
    assert sorted(r.backend for r in tracer.records("t")) == ["cache", "counters"]


async def test_aliased_backend_names_share_one_pipeline(autojump_clock: MockClock) -> None:
    redis = RecordingBackend()
    async with open_batch_scope({"counters": redis, "cache": redis}) as scope:
        scope.batch.call("GET", keys=["a"], backend="counters", owner="a")
        await scope.batch.call("GET", keys=["b"], backend="cache", owner="b")
    assert [len(p) for p in redis.pipelines] == [2]


async def test_declarations_never_awaited_leave_at_exit(autojump_clock: MockClock) -> None:
    backend = RecordingBackend()

    async def fire(batch: Batch) -> None:
        batch.call("SET", keys=["k"], args=["v"], owner="fire")

    async with open_batch_scope({"default": backend}) as scope:
        scope.start_participant(fire, scope.batch)
        scope.batch.call("SET", keys=["j"], args=["v"], owner="body")
    assert sorted(c[1] for p in backend.pipelines for c in p) == ["j", "k"]


async def test_unknown_backend_is_refused_at_declaration(autojump_clock: MockClock) -> None:
    async with open_batch_scope({"default": RecordingBackend()}) as scope:
        with pytest.raises(ValueError, match="unknown backend 'nope'"):
            scope.batch.call("GET", keys=["k"], backend="nope", owner="x")


async def test_a_dependency_cycle_is_broken_with_an_error(autojump_clock: MockClock) -> None:
    box: dict[str, Participant[None]] = {}

    async def wait_on(other: str) -> None:
        await trio.lowlevel.checkpoint()
        await box[other].wait()

    async with open_batch_scope({"default": RecordingBackend()}) as scope:
        box["a"] = scope.start_participant(wait_on, "b")
        box["b"] = scope.start_participant(wait_on, "a")
    for p in box.values():
        with pytest.raises(RuntimeError, match="deadlock"):
            p.result()


async def test_statistics_and_tracer_agree(autojump_clock: MockClock) -> None:
    backend = RecordingBackend()
    tracer = MemoryTracer()
    async with open_batch_scope({"default": backend}, tracer=tracer, trace_id="req") as scope:
        for owner in ("a", "b"):
            scope.start_participant(get_and_wait, scope.batch, owner, name=owner)
    stats = scope.statistics()
    assert (stats.rounds, stats.commands, stats.participants, stats.live) == (1, 2, 2, 0)
    (record,) = tracer.records("req")
    assert sorted(record.owners) == ["a", "b"]
    assert record.commands == ("GET", "GET")
    assert record.phase == "before"


async def test_a_trace_spanning_two_scopes_numbers_its_rounds_on(
    autojump_clock: MockClock,
) -> None:
    backend = RecordingBackend({"GET": b"1"})
    tracer = MemoryTracer()
    async with open_batch_scope({"default": backend}, tracer=tracer, trace_id="t") as first:
        first.start_participant(get_and_wait, first.batch, "auth")
    async with open_batch_scope({"default": backend}, tracer=tracer, trace_id="t",
                                rounds_before=first.statistics().rounds) as second:
        second.start_participant(get_and_wait, second.batch, "budgets")
    assert [r.round for r in tracer.records("t")] == [1, 2]
    assert second.statistics().rounds == 2
    assert tracer.summary("t").waits_before == 2


# ---------------------------------------------------------------- host=True, run_inline


async def test_inline_declarations_share_the_round_of_task_participants(
    autojump_clock: MockClock,
) -> None:
    """The body declares, starts a task and waits inline last: ONE round, no extra task."""
    backend = RecordingBackend({"GET": b"1"})

    async def decide_at_once() -> str:
        return "identity"  # what an identity in memory costs: no wait

    async with open_batch_scope({"default": backend}, host=True) as scope:
        who = await scope.run_inline(decide_at_once, name="auth")
        routing = scope.batch.call("GET", keys=["routing"], owner="routing")
        rl = scope.start_participant(get_and_wait, scope.batch, "rate_limits",
                                     name="rate_limits")
        budgets = await scope.run_inline(get_and_wait, scope.batch, "budgets", name="budgets")
        assert routing.done  # left in the round budgets waited for
        assert await routing == b"1"
    assert [len(p) for p in backend.pipelines] == [3]
    assert scope.statistics().rounds == 1
    assert scope.statistics().participants == 3
    assert (who.result(), rl.result(), budgets.result()) == ("identity", b"1", b"1")


async def test_the_host_holds_the_round_until_it_waits(autojump_clock: MockClock) -> None:
    """A task participant waiting does not send the round while the body still works: the
    body's later declaration joins it (the host counts as live, not waiting)."""
    backend = RecordingBackend({"GET": b"1"})
    async with open_batch_scope({"default": backend}, host=True) as scope:
        first = scope.start_participant(get_and_wait, scope.batch, "first", name="first")
        await trio.sleep(0.5)  # the task declares and waits meanwhile
        assert backend.pipelines == []
        late = scope.batch.call("GET", keys=["late"], owner="late")
    assert [len(p) for p in backend.pipelines] == [2]
    assert first.result() == b"1"
    assert late.result() == b"1"


async def test_an_inline_wait_after_a_round_lands_in_round_two(
    autojump_clock: MockClock,
) -> None:
    """Inline calls run one after another: the second one's declaration is a new round."""
    backend = RecordingBackend({"GET": b"1"})
    async with open_batch_scope({"default": backend}, host=True) as scope:
        await scope.run_inline(get_and_wait, scope.batch, "a")
        await scope.run_inline(get_and_wait, scope.batch, "b")
    assert [len(p) for p in backend.pipelines] == [1, 1]
    assert scope.statistics().rounds == 2


async def test_an_inline_error_is_captured_like_a_tasks(autojump_clock: MockClock) -> None:
    backend = RecordingBackend({"GET": b"1"})

    async def broken() -> None:
        raise KeyError("bug")

    async with open_batch_scope({"default": backend}, host=True) as scope:
        failed = await scope.run_inline(broken, name="broken")
        other = scope.start_participant(get_and_wait, scope.batch, "other", name="other")
    with pytest.raises(KeyError):
        failed.result()
    assert other.result() == b"1"


async def test_run_inline_needs_the_host(autojump_clock: MockClock) -> None:
    backend = RecordingBackend({"GET": b"1"})

    async def nothing() -> None:
        await trio.lowlevel.checkpoint()

    async with open_batch_scope({"default": backend}) as scope:
        with pytest.raises(RuntimeError, match="host=True"):
            await scope.run_inline(nothing)

    async def from_a_task(scope: BatchScope) -> None:
        await scope.run_inline(nothing)

    async with open_batch_scope({"default": backend}, host=True) as plain:
        task = plain.start_participant(from_a_task, plain, name="task")
    with pytest.raises(RuntimeError, match="host=True"):
        task.result()


async def test_cancelling_a_waiting_host_leaves_no_round_behind(
    autojump_clock: MockClock,
) -> None:
    backend = FaultyBackend(RecordingBackend({"GET": b"1"}), delay_s=5.0)
    with trio.move_on_after(1.0):
        async with open_batch_scope({"default": backend}, host=True) as scope:
            await scope.run_inline(get_and_wait, scope.batch, "host")
    assert trio.current_time() == 1.0
    assert scope.statistics().live == 0


async def test_reading_a_rounds_replies_yields_once(autojump_clock: MockClock) -> None:
    """The first await is the round's wait; the handles it resolved with it are read
    without giving up the CPU again (a cancel point still: see the next test)."""
    backend = RecordingBackend({"GET": b"1"})
    steps: list[str] = []

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            steps.append(task.name)

    async def three(batch: Batch) -> list[object]:
        handles = [batch.call("GET", keys=[f"k{i}"], owner="three") for i in range(3)]
        return [await h for h in handles]

    trio.lowlevel.add_instrument(Steps())
    async with open_batch_scope({"default": backend}) as scope:
        p = scope.start_participant(three, scope.batch, name="three")
    assert p.result() == [b"1", b"1", b"1"]
    assert steps.count("three") == 2  # its start, and its wake-up after the round


async def test_awaiting_a_resolved_handle_is_still_a_cancel_point(
    autojump_clock: MockClock,
) -> None:
    backend = RecordingBackend({"GET": b"1"})
    reached: list[object] = []

    async def read_after_cancel(batch: Batch, outer: trio.CancelScope) -> None:
        first = batch.call("GET", keys=["a"], owner="o")
        second = batch.call("GET", keys=["b"], owner="o")
        await first
        outer.cancel()
        reached.append(await second)

    with trio.CancelScope() as outer:
        async with open_batch_scope({"default": backend}) as scope:
            scope.start_participant(read_after_cancel, scope.batch, outer, name="p")
    assert outer.cancelled_caught
    assert reached == []  # cancelled at the second await, though its reply was there


def count_steps(names: list[str]) -> trio.abc.Instrument:
    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            names.append(task.name)

    return Steps()


async def test_a_host_alone_sends_its_round_from_its_own_task(
    autojump_clock: MockClock,
) -> None:
    """Every check inline: the host waiting is the round, sent from its task (no
    "batch flush" task); a round with a task participant still leaves from a flush task."""
    backend = RecordingBackend({"GET": b"1"})
    steps: list[str] = []
    trio.lowlevel.add_instrument(count_steps(steps))
    async with open_batch_scope({"default": backend}, host=True) as scope:
        routing = scope.batch.call("GET", keys=["routing"], owner="routing")
        budgets = await scope.run_inline(get_and_wait, scope.batch, "budgets", name="budgets")
        assert routing.done  # it left in the same round
        assert await routing == b"1"
        second = await scope.run_inline(get_and_wait, scope.batch, "second", name="second")
    assert [len(p) for p in backend.pipelines] == [2, 1]
    assert scope.statistics().rounds == 2
    assert (budgets.result(), second.result()) == (b"1", b"1")
    assert "batch flush" not in steps

    steps.clear()
    async with open_batch_scope({"default": backend}, host=True) as scope:
        rl = scope.start_participant(get_and_wait, scope.batch, "rate_limits",
                                     name="rate_limits")
        budgets = await scope.run_inline(get_and_wait, scope.batch, "budgets", name="budgets")
    assert [len(p) for p in backend.pipelines[2:]] == [2]
    assert (rl.result(), budgets.result()) == (b"1", b"1")
    assert "batch flush" in steps


@pytest.mark.parametrize("tasks", [True, False])
async def test_cancelling_a_host_flushing_alone_fails_its_round(
    autojump_clock: MockClock, tasks: bool,
) -> None:
    """The host's own round is cut at its cancellation, as a flush task's would be: no
    handle dangles, nothing stays live, and the next scope works (with or without a
    nursery)."""
    backend = FaultyBackend(RecordingBackend({"GET": b"1"}), delay_s=5.0)
    handles = []
    with trio.move_on_after(1.0):
        async with open_batch_scope({"default": backend}, host=True, tasks=tasks) as scope:
            handles.append(scope.batch.call("GET", keys=["other"], owner="other"))
            await scope.run_inline(get_and_wait, scope.batch, "host")
    assert trio.current_time() == 1.0
    assert scope.statistics().live == 0
    assert handles[0].done
    with pytest.raises(BackendUnavailable):
        handles[0].result()


# ---------------------------------------------------------------- tasks=False


async def test_a_scope_without_tasks_opens_no_nursery(autojump_clock: MockClock) -> None:
    """host=True, tasks=False: no nursery, every round from the host's task, the same
    rounds as with one; leftovers still leave on exit; a task participant is refused."""
    backend = RecordingBackend({"GET": b"1"})
    steps: list[str] = []
    trio.lowlevel.add_instrument(count_steps(steps))
    nurseries = len(trio.lowlevel.current_task().child_nurseries)
    async with open_batch_scope({"default": backend}, host=True, tasks=False) as scope:
        assert len(trio.lowlevel.current_task().child_nurseries) == nurseries
        routing = scope.batch.call("GET", keys=["routing"], owner="routing")
        budgets = await scope.run_inline(get_and_wait, scope.batch, "budgets", name="budgets")
        assert routing.done  # it left in the same round
        second = await scope.run_inline(get_and_wait, scope.batch, "second", name="second")
        leftover = scope.batch.call("GET", keys=["left"], owner="left")
        with pytest.raises(RuntimeError, match="tasks=False"):
            scope.start_participant(get_and_wait, scope.batch, "task")
        with pytest.raises(RuntimeError, match="tasks=False"):
            _ = scope.cancel_scope
    assert [len(p) for p in backend.pipelines] == [2, 1, 1]
    assert scope.statistics().rounds == 3
    assert scope.statistics().live == 0
    assert (budgets.result(), second.result(), leftover.result()) == (b"1", b"1", b"1")
    assert "batch flush" not in steps
    with pytest.raises(BatchClosed):
        scope.batch.call("GET", keys=["late"], owner="late")


async def test_a_scope_without_tasks_needs_a_host() -> None:
    with pytest.raises(ValueError, match="host=True"):
        open_batch_scope({"default": RecordingBackend({})}, tasks=False)


async def test_a_body_without_tasks_that_raises_sends_no_leftovers(
    autojump_clock: MockClock,
) -> None:
    """As with a nursery (whose cancellation would cut the leftovers' flush): the body's
    error propagates, nothing leaves, the scope is closed."""
    backend = RecordingBackend({"GET": b"1"})
    with pytest.raises(KeyError):
        async with open_batch_scope({"default": backend}, host=True, tasks=False) as scope:
            leftover = scope.batch.call("GET", keys=["left"], owner="left")
            raise KeyError("body")
    assert backend.pipelines == []
    assert not leftover.done
    assert scope.statistics().live == 0
    with pytest.raises(BatchClosed):
        scope.batch.call("GET", keys=["late"], owner="late")
