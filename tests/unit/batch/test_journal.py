"""The journal, dead letters and replay, on MockClock with recording backends."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
import trio

from triogate.batch import (
    CommandError,
    DeadLetterFile,
    Journal,
    JournalEntry,
    Script,
    Settler,
    open_post_call_batch,
)
from triogate.batch._journal import decode_entry, encode_entry
from triogate.batch.testing import FaultyBackend, RecordingBackend

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from trio.testing import MockClock

    from triogate.batch._backend import Wire



SETTLE = Script.from_source("settle_once", "return redis.call('INCRBY', KEYS[1], ARGV[1])\n")
HOUR_MS = 3_600_000


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


async def letters(tmp_path: Path) -> list[dict[str, object]]:
    path = trio.Path(tmp_path / "dead-letter.jsonl")  # in a worker thread: not on the loop
    if not await path.exists():
        return []
    return [orjson.loads(line) for line in (await path.read_bytes()).splitlines()]


def settler_for(backend: object, tmp_path: Path, clock: Clock, **kw: object) -> Settler:
    return Settler({"default": backend}, journal=Journal(tmp_path / "journal"),  # type: ignore[dict-item]
                   dead_letters=DeadLetterFile(tmp_path / "dead-letter.jsonl"),
                   scripts=[SETTLE], replay_interval_s=1.0, clock_ms=clock, **kw)  # type: ignore[arg-type]


def replies(table: dict[str, list[object]]) -> Callable[[Wire], object]:
    """Answer each command (by its first key) with the next reply of its list."""
    def respond(wire: Wire) -> object:
        key = str(wire[3] if wire[0] in ("EVALSHA", "EVAL") else wire[1])
        queue = table.get(key)
        return queue.pop(0) if queue else 1
    return respond



async def eventually(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait (mock time) until ``predicate`` holds: journal writes run in worker threads,
    so a fixed mock-time sleep may end before a replay round has finished (a flake)."""
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.25)

async def test_transient_replies_are_journaled_and_retried_permanent_ones_dead_lettered(
    file_clock: MockClock, tmp_path: Path
) -> None:
    backend = RecordingBackend(respond=replies({
        "spend": [CommandError("LOADING Redis is loading the dataset in memory"),
                  CommandError("OOM command not allowed when used memory > 'maxmemory'")],
        "broken": [CommandError("WRONGTYPE Operation against a key holding the wrong kind")],
        "cached": [CommandError("LOADING Redis is loading the dataset in memory")],
    }))
    wall = Clock()
    settler = settler_for(backend, tmp_path, wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        async with open_post_call_batch(settler, trace_id="r1") as post:
            post.call(SETTLE, keys=["spend"], args=[7], owner="budgets", replay_window_ms=HOUR_MS)
            post.call("HINCRBY", keys=["broken"], args=["n", 1], owner="routing")
            post.call("SET", keys=["cached"], args=["v"], owner="cache", journal=False)
        await settler.wait_drained()
        stats = settler.statistics()
        assert (stats.journal_pending, stats.retried, stats.dead_lettered) == (1, 1, 1)
        # The first replay meets OOM (still transient), the second lands.
        await eventually(lambda: settler.statistics().journal_pending == 0)
        assert settler.statistics().replayed == 1
        nursery.cancel_scope.cancel()
    sent = [(w[0], w[3] if w[0] == "EVALSHA" else w[1]) for p in backend.pipelines for w in p]
    assert sent == [("EVALSHA", "spend"), ("HINCRBY", "broken"), ("SET", "cached"),
                    ("EVALSHA", "spend"), ("EVALSHA", "spend")]  # the SET was never retried
    (letter,) = await letters(tmp_path)
    assert letter["owner"] == "routing" and letter["trace_id"] == "r1"
    assert str(letter["reason"]).startswith("WRONGTYPE")
    assert letter["keys"] == ["broken"] and letter["args"] == ["n", 1]


async def test_replay_forgets_only_what_was_applied(
    file_clock: MockClock, tmp_path: Path
) -> None:
    # Two commands of one request; during replay one is refused (LOADING) and stays.
    table: dict[str, list[object]] = {"b": [CommandError("LOADING ..."),
                                            CommandError("READONLY You can't write")]}
    inner = RecordingBackend(respond=replies(table))
    backend = FaultyBackend(inner)
    backend.down = True
    wall = Clock()
    settler = settler_for(backend, tmp_path, wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        async with open_post_call_batch(settler, trace_id="r1") as post:
            post.call("INCRBY", keys=["a"], args=[1], owner="budgets")
            post.call("INCRBY", keys=["b"], args=[2], owner="rate_limits")
        await settler.wait_drained()
        backend.down = False
        await eventually(lambda: settler.statistics().journal_pending == 0)
        nursery.cancel_scope.cancel()
    assert [w[1] for p in inner.pipelines for w in p] == ["a", "b", "b", "b"]
    assert not await letters(tmp_path)


async def test_a_write_older_than_its_window_is_dead_lettered_not_applied(
    file_clock: MockClock, tmp_path: Path
) -> None:
    inner = RecordingBackend()
    backend = FaultyBackend(inner)
    backend.down = True
    wall = Clock()
    settler = settler_for(backend, tmp_path, wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        async with open_post_call_batch(settler, trace_id="old") as post:
            post.call(SETTLE, keys=["spend"], args=[5], owner="budgets", replay_window_ms=HOUR_MS)
            post.call("HINCRBY", keys=["forever"], args=["n", 1], owner="routing")
        await settler.wait_drained()
        wall.now_ms += HOUR_MS  # the marker that guards the settlement has expired
        backend.down = False
        await eventually(lambda: settler.statistics().journal_pending == 0)
        nursery.cancel_scope.cancel()
    assert [w[0] for p in inner.pipelines for w in p] == ["HINCRBY"]  # no window: replayed
    (letter,) = await letters(tmp_path)
    assert letter["script"] == "settle_once" and "replay window" in str(letter["reason"])


async def test_scripts_are_journaled_by_name_and_sha_and_loaded_from_the_registry(
    file_clock: MockClock, tmp_path: Path
) -> None:
    changed = Script.from_source("gone", "return 2\n")
    entry = JournalEntry("r1", "default", (), 0)
    line = encode_entry(JournalEntry(
        "r1", "default",
        tuple(attrs_command(s, k) for s, k in ((SETTLE, "spend"), (changed, "other"))),
        Clock()(), (HOUR_MS, None)))
    assert b"INCRBY" not in line and SETTLE.sha.encode() in line  # no source, a SHA
    decoded = decode_entry(line)
    assert decoded.commands[0].script is not None
    assert decoded.commands[0].script.source == b""
    assert decoded.window_ms(0) == HOUR_MS and decoded.window_ms(1) is None
    # A server that knows no script: the registry's source is EVALed for the known one;
    # the one this process does not have (or has with another SHA) is dead-lettered.
    backend = RecordingBackend(scripts_loaded=False)
    journal = Journal(tmp_path / "journal")
    await journal.open()
    assert await journal.append([decoded]) == []
    journal.close()
    settler = settler_for(backend, tmp_path, Clock())
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        await eventually(lambda: settler.statistics().journal_pending == 0)
        nursery.cancel_scope.cancel()
    assert [w[0] for p in backend.pipelines for w in p] == ["EVALSHA", "EVALSHA", "EVAL"]
    (letter,) = await letters(tmp_path)
    assert letter["script"] == "gone" and "registry" in str(letter["reason"])
    del entry


def attrs_command(script: Script, key: str) -> object:
    from triogate.batch import Command
    return Command(name="EVALSHA", keys=(key,), args=(1,), owner="budgets", backend="default",
                   script=script)


async def test_the_journal_is_bounded_and_replays_in_chunks(
    file_clock: MockClock, tmp_path: Path
) -> None:
    inner = RecordingBackend()
    backend = FaultyBackend(inner)
    backend.down = True
    wall = Clock()
    settler = Settler({"default": backend}, journal=Journal(tmp_path / "journal", max_bytes=4000),
                      dead_letters=DeadLetterFile(tmp_path / "dead-letter.jsonl"),
                      replay_chunk_commands=10, replay_max_chunks=2, clock_ms=wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        for i in range(60):
            async with open_post_call_batch(settler, trace_id=f"r{i}") as post:
                post.call("INCRBY", keys=[f"k{i}"], args=[1], owner="budgets")
        await settler.wait_drained()
        stats = settler.statistics()
        assert 0 < stats.journal_bytes <= 4000
        assert stats.journal_pending + stats.dead_lettered == 60 and stats.dead_lettered > 0
        assert all("journal full" in str(x["reason"]) for x in await letters(tmp_path))
        backend.down = False
        with trio.fail_after(30):
            while settler.statistics().journal_pending:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert settler.statistics().journal_bytes == 0
    assert max(len(p) for p in inner.pipelines) == 10
    assert sum(len(p) for p in inner.pipelines) == stats.journal_pending
