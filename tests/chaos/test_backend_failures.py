"""Redis killed, paused and restarted under triogate.batch: decisions, not hangs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import (
    BackendUnavailable,
    Batch,
    Journal,
    RespBackend,
    Script,
    Settler,
    open_batch_scope,
    open_post_call_batch,
)

if TYPE_CHECKING:
    from pathlib import Path

    from tests.chaos.conftest import KillableServer

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

#: Idempotent by request id, as every post-call write must be: a marker in the counter's
#: hash tag guards the increment.
INCR_ONCE = Script.from_source(
    "incr_once",
    "-- KEYS[1] marker, KEYS[2] counter; ARGV[1] amount\n"
    "if redis.call('SET', KEYS[1], 1, 'NX', 'EX', 3600) then\n"
    "  return redis.call('INCRBY', KEYS[2], ARGV[1])\nend\nreturn false\n",
)


async def read(batch: Batch, key: str) -> object:
    return await batch.call("GET", keys=[key], owner=key)


async def test_a_server_killed_mid_pipeline_fails_every_owner_quickly(
    killable_server: KillableServer,
) -> None:
    backend = RespBackend(killable_server.url, command_timeout_s=2.0)
    await backend.execute([("SET", "a", "1")])  # a pooled connection
    started = trio.current_time()
    async with trio.open_nursery() as nursery:

        async def killer() -> None:
            await trio.sleep(0.05)
            killable_server.kill()

        nursery.start_soon(killer)
        async with open_batch_scope({"default": backend}) as scope:
            # A busy script holds the server while it is killed: mid-flight.
            slow = scope.batch.call("EVAL", args=["while true do end", 0], owner="slow")
            other = scope.batch.call("GET", keys=["a"], owner="other")
            with pytest.raises(BackendUnavailable):
                await slow
            with pytest.raises(BackendUnavailable):
                await other
    assert trio.current_time() - started < 1.0  # the reset, not the timeout


async def test_a_paused_server_costs_the_timeout_not_a_hang(
    killable_server: KillableServer,
) -> None:
    backend = RespBackend(killable_server.url, command_timeout_s=0.3)
    await backend.execute([("PING",)])
    killable_server.pause()
    try:
        started = trio.current_time()
        async with open_batch_scope({"default": backend}) as scope:
            p = scope.start_participant(read, scope.batch, "a")
        with pytest.raises(BackendUnavailable, match=r"no reply within 0\.3 s"):
            p.result()
        assert 0.3 <= trio.current_time() - started < 1.0
    finally:
        killable_server.resume()
    assert await backend.execute([("PING",)]) == [b"PONG"]


async def test_the_same_client_recovers_after_a_restart(killable_server: KillableServer) -> None:
    backend = RespBackend(killable_server.url, command_timeout_s=1.0)
    assert await backend.execute([("SET", "a", "1")]) == [b"OK"]
    killable_server.kill()
    with pytest.raises(BackendUnavailable):
        await backend.execute([("GET", "a")])
    await killable_server.restart()
    assert await backend.execute([("SET", "a", "2"), ("GET", "a")]) == [b"OK", b"2"]


async def test_journal_replays_when_redis_is_back_and_twice_changes_nothing(
    killable_server: KillableServer, tmp_path: Path
) -> None:
    backend = RespBackend(killable_server.url, command_timeout_s=0.5)
    journal = Journal(tmp_path / "journal")
    settler = Settler({"default": backend}, journal=journal, replay_interval_s=0.1)

    def settle(post: object, request_id: str, amount: int) -> None:
        post.call(  # type: ignore[attr-defined]
            INCR_ONCE,
            keys=[f"tg:{{k1}}:done:{request_id}", "tg:{k1}:spend"],
            args=[amount],
            owner="budgets",
        )

    killable_server.kill()
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        for i in range(3):
            async with open_post_call_batch(settler, trace_id=f"req-{i}") as post:
                settle(post, f"req-{i}", 10)
        with trio.fail_after(5):
            await settler.wait_drained()
        assert settler.statistics().journal_pending == 3
        stale = journal.pending
        await killable_server.restart()
        with trio.fail_after(5):
            while settler.statistics().journal_pending:
                await trio.sleep(0.05)
        assert await backend.execute([("GET", "tg:{k1}:spend")]) == [b"30"]

        nursery.cancel_scope.cancel()

    # The same entries again, as a process would leave them that died after its replay
    # landed but before it rewrote its journal: the next process claims and replays
    # them, and no counter changes.
    ghost = Journal(tmp_path / "journal")
    await ghost.open()
    await ghost.append(stale)
    ghost.close()  # entries remain: an orphan file
    successor = Settler({"default": backend}, journal=Journal(tmp_path / "journal"))
    async with trio.open_nursery() as nursery:
        await nursery.start(successor.run)
        with trio.fail_after(5):
            while successor.statistics().replayed < 3:
                await trio.sleep(0.05)
        assert await backend.execute([("GET", "tg:{k1}:spend")]) == [b"30"]
        nursery.cancel_scope.cancel()
