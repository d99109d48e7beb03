"""The settler merges one principal's settlements of a flush into one script call
(``batch/_merge.py``, ``budget_settle_many.lua``): every owner gets its own call's reply,
a failed merged call falls back to the single calls, and the journal keeps single calls."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
import trio

from triogate.batch import (
    BackendUnavailable,
    CommandError,
    Journal,
    Merge,
    Script,
    Settler,
    post_call_batch,
)
from triogate.batch.testing import FaultyBackend
from triogate.governance.budgets import RESERVE, SETTLE, SETTLE_MANY, SETTLE_MERGE
from triogate.governance.keys import budget_keys, budget_marker

from .lua.support import hash_ints, run

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from triogate.batch import Handle, RespBackend
    from triogate.batch._backend import Wire

pytestmark = pytest.mark.integration

#: SETTLE_MERGE from 2 calls (the gateway's starts at 4): small groups for the tests.
MERGE = Merge(single=SETTLE, merged=SETTLE_MANY)

NOW_MS = 1_700_000_000_000


class Spy(FaultyBackend):
    """A wrapper that keeps every pipeline it sent, without fusion (one wire a call)."""

    script_fuser = None  # type: ignore[assignment]

    def __init__(self, inner: RespBackend) -> None:
        super().__init__(inner)
        self.pipelines: list[list[Wire]] = []

    async def execute(self, commands: Sequence[Wire]) -> list[object]:
        self.pipelines.append(list(commands))
        return await super().execute(commands)

    def script_calls(self, script: Script) -> int:
        return sum(1 for p in self.pipelines for w in p
                   if (w[0] == "EVALSHA" and w[1] == script.sha)
                   or (w[0] == "EVAL" and w[1] == script.source))


async def _principal(redis: RespBackend, holds: dict[str, int]) -> list[str]:
    """A principal with a reservation per request id; its settle keys. Loads the
    settlement scripts (a wire per call, no NOSCRIPT retries to count)."""
    await redis.execute([("SCRIPT", "LOAD", s.source) for s in (SETTLE, SETTLE_MANY)])
    pid = uuid.uuid4().hex
    budget = budget_keys("key", pid, 0).as_tuple()
    for rid, amount in holds.items():
        assert (await run(redis, RESERVE, budget, [NOW_MS, rid, amount, 10**9, 60_000, 0]))[0] == 1  # type: ignore[index]
    return [*budget, budget_marker("key", pid, NOW_MS)]


async def _settle(
    settler: Settler, calls: list[tuple[list[str], list[object]]], journal: Journal | None = None
) -> list[Handle[Any]]:
    """Submit one post-call batch per call, all before the settler's next flush."""
    handles = []
    for i, (keys, args) in enumerate(calls):
        with post_call_batch(settler, trace_id=f"t{i}") as post:
            handles.append(post.call(SETTLE, keys=keys, args=args, backend="counters",
                                     owner="budgets"))
    await settler.wait_drained()
    return handles


async def test_one_principals_settlements_leave_as_one_merged_call(redis: RespBackend) -> None:
    spy = Spy(redis)
    settler = Settler({"counters": spy}, merges=[SETTLE_MERGE])
    keys = await _principal(redis, {f"r{i}": 100 for i in range(6)})
    other = await _principal(redis, {"o1": 7})
    calls: list[tuple[list[str], list[object]]] = [
        (keys, [f"r{i}", 10 * i, 0, 600_000]) for i in range(6)]
    calls.insert(3, (other, ["o1", 5, 0, 600_000]))
    calls.append((keys, ["r2", 20, 0, 600_000]))  # a duplicate: a replay
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        handles = await _settle(settler, calls)
        nursery.cancel_scope.cancel()
    replies = [h.result() for h in handles]
    spend = [0, 10, 30, None, 60, 100, 150]
    assert replies[:3] + replies[4:7] == [[1, 100, s] for s in spend if s is not None]
    assert replies[3] == [1, 7, 5]  # alone: a group of one
    assert replies[7] == [0, 0, 150]
    assert spy.script_calls(SETTLE_MANY) == 1
    assert spy.script_calls(SETTLE) == 1
    assert await hash_ints(redis, keys[0]) == {"spend": 150, "reserved": 0}


@pytest.mark.parametrize("broken", [
    "return redis.error_reply('ERR refused')",  # an error reply
    "return 1",  # not one reply per call
    "error('raised')",  # a Lua error
])
async def test_a_failed_merged_call_falls_back_to_the_single_calls(
    redis: RespBackend, broken: str
) -> None:
    """Nothing is dead-lettered or lost: each call goes again alone, in the same flush."""
    spy = Spy(redis)
    merge = Merge(single=SETTLE, merged=Script.from_source("broken", broken))
    settler = Settler({"counters": spy}, merges=[merge])
    keys = await _principal(redis, {"r1": 40, "r2": 40, "r3": 40})
    await redis.execute([("SCRIPT", "LOAD", merge.merged.source)])
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        handles = await _settle(settler, [(keys, [f"r{i}", i, 0, 600_000]) for i in (1, 2, 3)])
        nursery.cancel_scope.cancel()
    assert [h.result() for h in handles] == [[1, 40, 1], [1, 40, 3], [1, 40, 6]]
    assert spy.script_calls(merge.merged) == 1
    assert spy.script_calls(SETTLE) == 3
    assert settler.statistics().dead_lettered == 0
    assert await hash_ints(redis, keys[0]) == {"spend": 6, "reserved": 0}


async def test_a_refused_request_fails_alone(redis: RespBackend) -> None:
    """One request's bad argument refuses the merged call; the others settle, the bad one
    gets its own call's error (and only it is dead-lettered)."""
    spy = Spy(redis)
    settler = Settler({"counters": spy}, merges=[MERGE])
    keys = await _principal(redis, {"r1": 40, "r2": 40, "r3": 40})
    calls: list[tuple[list[str], list[object]]] = [
        (keys, ["r1", 1, 0, 600_000]), (keys, ["r2", -5, 0, 600_000]),
        (keys, ["r3", 3, 0, 600_000])]
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        handles = await _settle(settler, calls)
        nursery.cancel_scope.cancel()
    assert handles[0].result() == [1, 40, 1]
    with pytest.raises(CommandError, match="budget_settle:"):
        handles[1].result()
    assert handles[2].result() == [1, 40, 4]
    assert settler.statistics().dead_lettered == 1
    assert (spy.script_calls(SETTLE_MANY), spy.script_calls(SETTLE)) == (1, 3)


async def test_a_merged_call_runs_after_a_script_flush(redis: RespBackend) -> None:
    """NOSCRIPT on the merged call: EVAL, as for any script."""
    spy = Spy(redis)
    settler = Settler({"counters": spy}, merges=[MERGE])
    keys = await _principal(redis, {"r1": 40, "r2": 40})
    await redis.execute([("SCRIPT", "FLUSH")])
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        handles = await _settle(settler, [(keys, ["r1", 1, 0, 600_000]),
                                          (keys, ["r2", 2, 0, 600_000])])
        nursery.cancel_scope.cancel()
    assert [h.result() for h in handles] == [[1, 40, 1], [1, 40, 3]]
    assert (spy.script_calls(SETTLE_MANY), spy.script_calls(SETTLE)) == (2, 0)  # EVALSHA, EVAL


async def test_the_journal_keeps_single_calls_and_replays_them(
    redis: RespBackend, tmp_path: Path
) -> None:
    """Backend down during the merged call: each request's call is journaled alone (one
    entry per request), and replayed alone (merged or not, a replay is per request)."""
    backend = FaultyBackend(redis)
    settler = Settler({"counters": backend}, merges=[MERGE],
                      journal=Journal(tmp_path / "journal"), scripts=[SETTLE],
                      replay_interval_s=0.05)
    keys = await _principal(redis, {"r1": 40, "r2": 40})
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        backend.down = True
        handles = await _settle(settler, [(keys, ["r1", 1, 0, 600_000]),
                                          (keys, ["r2", 2, 0, 600_000])])
        for h in handles:
            with pytest.raises(BackendUnavailable):
                h.result()
        assert settler.statistics().journaled == 2
        journal = settler._journal
        assert journal is not None
        assert [len(e.commands) for e in journal.pending] == [1, 1]
        assert all(c.script == SETTLE for e in journal.pending for c in e.commands)
        backend.down = False
        with trio.fail_after(10):
            while settler.statistics().journal_pending:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert await hash_ints(redis, keys[0]) == {"spend": 3, "reserved": 0}
