"""The spend-log writer's logic on MockClock, with an in-memory sink."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import trio

from triogate.errors import StoreError
from triogate.store import SpendLogRow, SpendLogWriter, StoreDataError
from triogate.store.spendlog import DEAD_LETTER_FILE, decode_rows, encode_rows

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from trio.testing import MockClock


class MemorySink:
    """Records each batch and when it was written; fails the first ``fail_times`` tries."""

    def __init__(self, *, fail_times: int = 0, delay_s: float = 0.0) -> None:
        self.batches: list[list[str]] = []
        self.times: list[float] = []
        self.attempt_times: list[float] = []
        self.fail_times = fail_times
        self.delay_s = delay_s
        self.ids: set[str] = set()

    async def insert_spend_logs(self, rows: Sequence[SpendLogRow]) -> int:
        self.attempt_times.append(trio.current_time())
        await trio.sleep(self.delay_s)
        if self.fail_times:
            self.fail_times -= 1
            raise StoreError("insert spend logs failed: OperationalError: database is down")
        new = [r.request_id for r in rows if r.request_id not in self.ids]
        self.ids.update(new)
        self.batches.append([r.request_id for r in rows])
        self.times.append(trio.current_time())
        return len(new)


class HungSink:
    """A database that takes every batch and never answers."""

    async def insert_spend_logs(self, rows: Sequence[SpendLogRow]) -> int:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


class PickySink(MemorySink):
    """Refuses, for its data, any batch that holds a row whose request id starts "bad"."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def insert_spend_logs(self, rows: Sequence[SpendLogRow]) -> int:
        self.attempts += 1
        if any(r.request_id.startswith("rbad") for r in rows):
            await trio.lowlevel.checkpoint()
            raise StoreDataError("insert spend logs failed: DataError: NUL byte")
        return await super().insert_spend_logs(rows)


def row(i: int | str) -> SpendLogRow:
    return SpendLogRow(request_id=f"r{i}", api="chat", tags=("a", "b"), cost_nanousd=7)


async def test_a_lone_row_is_written_after_exactly_one_interval(autojump_clock: MockClock) -> None:
    sink = MemorySink()
    writer = SpendLogWriter(sink, interval_s=1.0, batch_rows=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.submit_nowait(row(0))
        await trio.sleep(0.5)
        writer.submit_nowait(row(1))
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert sink.batches == [["r0", "r1"]]
    assert sink.times == [1.0]
    assert writer.statistics().written == 2


async def test_a_full_batch_is_written_at_once(autojump_clock: MockClock) -> None:
    sink = MemorySink()
    writer = SpendLogWriter(sink, interval_s=60.0, batch_rows=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(7):
            writer.submit_nowait(row(i))
        await trio.sleep(1)
        assert sink.batches == [["r0", "r1", "r2"], ["r3", "r4", "r5"]]
        assert sink.times == [0.0, 0.0]
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert sink.batches[2] == ["r6"]
    assert sink.times[2] == 60.0
    stats = writer.statistics()
    assert (stats.queued, stats.written, stats.batches, stats.failures) == (0, 7, 3, 0)


async def test_wait_drained_writes_now_and_covers_rows_submitted_during_a_write(
    autojump_clock: MockClock,
) -> None:
    sink = MemorySink(delay_s=0.25)
    writer = SpendLogWriter(sink, interval_s=10.0, batch_rows=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(3):
            writer.submit_nowait(row(i))
        await trio.sleep(0.1)  # the first full batch is in flight
        writer.submit_nowait(row(3))
        writer.submit_nowait(row(4))
        await writer.wait_drained()
        assert trio.current_time() == 0.75  # three writes of 0.25 s, no interval wait
        nursery.cancel_scope.cancel()
    assert sink.batches == [["r0", "r1"], ["r2", "r3"], ["r4"]]


async def test_wait_drained_with_nothing_queued_is_a_checkpoint(autojump_clock: MockClock) -> None:
    writer = SpendLogWriter(MemorySink())
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await writer.wait_drained()


async def test_failed_writes_keep_the_rows_and_retry_with_backoff(
    autojump_clock: MockClock,
) -> None:
    sink = MemorySink(fail_times=4)
    writer = SpendLogWriter(
        sink, interval_s=1.0, batch_rows=100, min_backoff_s=0.1, max_backoff_s=0.3
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.submit_nowait(row(0))
        await trio.sleep(1.05)
        writer.submit_nowait(row(1))  # joins the batch being retried
        await writer.wait_drained()
        nursery.cancel_scope.cancel()
    # Backoff 0.1, 0.2, 0.3 (capped), 0.3 after the attempt at 1.0.
    assert sink.attempt_times == pytest.approx([1.0, 1.1, 1.3, 1.6, 1.9])
    assert sink.batches == [["r0", "r1"]]
    stats = writer.statistics()
    assert (stats.failures, stats.written, stats.batches) == (4, 2, 1)


async def test_cancelled_writer_spills_queued_rows_and_the_next_one_resubmits_them(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    folder = tmp_path / "spendlog"
    down = MemorySink(fail_times=1000)
    first = SpendLogWriter(down, interval_s=1.0, fallback_dir=folder)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        for i in range(5):
            first.submit_nowait(row(i))
        await trio.sleep(3)  # failing and retrying
        nursery.cancel_scope.cancel()
    assert down.batches == []
    assert first.statistics().spilled == 5 and first.statistics().queued == 0
    spilled = list(folder.glob("spill-*.jsonl"))
    assert len(spilled) == 1
    assert [r.request_id for r in decode_rows(await trio.Path(spilled[0]).read_bytes())] == [
        f"r{i}" for i in range(5)
    ]
    assert not list(folder.glob("writer-*.lock"))

    sink = MemorySink()
    second = SpendLogWriter(sink, interval_s=1.0, fallback_dir=folder)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        assert second.statistics().recovered == 5
        second.submit_nowait(row(5))
        await second.wait_drained()
        # The recovered file is gone once its rows are written; only our lock is left.
        assert [p.name[:7] for p in folder.iterdir()] == ["writer-"]
        nursery.cancel_scope.cancel()
    assert [rid for batch in sink.batches for rid in batch] == [f"r{i}" for i in range(6)]
    assert sorted(folder.iterdir()) == []


async def test_recovered_rows_still_unwritten_at_exit_are_spilled_again(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    folder = tmp_path / "spendlog"
    folder.mkdir()
    await trio.Path(folder / "spill-old.jsonl").write_bytes(encode_rows([row(0), row(1)]))
    writer = SpendLogWriter(MemorySink(fail_times=1000), fallback_dir=folder)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.submit_nowait(row(2))
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].name.startswith("spill-")
    spilled = decode_rows(await trio.Path(files[0]).read_bytes())
    assert [r.request_id for r in spilled] == ["r0", "r1", "r2"]


async def test_a_dead_writers_claimed_files_are_taken_over_but_a_live_ones_are_not(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    folder = tmp_path / "spendlog"
    folder.mkdir()
    # A writer that died (SIGKILL) after claiming a spill file: its lock file is free.
    (folder / "writer-dead0000.lock").touch()
    await trio.Path(folder / "owned-dead0000-0.jsonl").write_bytes(encode_rows([row("dead")]))
    # A database that never answers: the live writer keeps its rows in flight. (It used
    # to be a sink failing 1000 times; with the autojump clock, the live writer ran
    # through those retries in virtual time while `other` opened its folder in a real
    # thread, wrote its rows on the 1001st try, and nothing was left to spill.)
    live_sink = HungSink()
    live = SpendLogWriter(live_sink, fallback_dir=folder)
    await trio.Path(folder / "spill-a.jsonl").write_bytes(encode_rows([row("a")]))
    sink = MemorySink()
    async with trio.open_nursery() as nursery:
        await nursery.start(live.run)  # takes spill-a and the dead writer's file
        assert live.statistics().recovered == 2
        other = SpendLogWriter(sink, fallback_dir=folder)
        await nursery.start(other.run)  # the live writer's files are not its to take
        assert other.statistics().recovered == 0
        nursery.cancel_scope.cancel()
    assert sink.batches == []
    assert not (folder / "writer-dead0000.lock").exists()
    rows = [r.request_id for p in folder.glob("spill-*.jsonl")
            for r in decode_rows(await trio.Path(p).read_bytes())]
    assert sorted(rows) == ["ra", "rdead"]


async def test_a_torn_line_is_skipped_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    data = encode_rows([row(0), row(1)]) + b'{"request_id": "r2", "ap'
    with caplog.at_level(logging.ERROR):
        rows = decode_rows(data, source="f")
    assert [r.request_id for r in rows] == ["r0", "r1"]
    assert "unreadable spend-log line 3 of f" in caplog.text


async def test_rows_round_trip_through_json_lines() -> None:
    original = SpendLogRow(
        request_id="x",
        api="responses",
        key_hash="h",
        tags=("t1", "t2"),
        cost_nanousd=2**62,
        cache_hit=True,
        status="cancelled",
        http_status=499,
        start_time_ms=1,
        end_time_ms=2,
    )
    assert decode_rows(encode_rows([original])) == [original]


async def test_without_a_fallback_folder_lost_rows_are_logged(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    writer = SpendLogWriter(MemorySink(fail_times=1000))
    with caplog.at_level(logging.ERROR):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            writer.submit_nowait(row(0))
            await trio.sleep(2)
            nursery.cancel_scope.cancel()
    assert "1 rows unwritten and no fallback folder" in caplog.text


async def test_run_twice_at_once_is_an_error(autojump_clock: MockClock) -> None:
    writer = SpendLogWriter(MemorySink())
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        with pytest.raises(RuntimeError, match="already running"):
            await writer.run()
        nursery.cancel_scope.cancel()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        SpendLogWriter(MemorySink(), interval_s=0)
    with pytest.raises(ValueError):
        SpendLogWriter(MemorySink(), batch_rows=0)


async def test_rows_the_database_refuses_are_set_aside_and_the_rest_flows(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    sink = PickySink()
    folder = tmp_path / "spendlog"
    writer = SpendLogWriter(sink, interval_s=1.0, batch_rows=128, fallback_dir=folder)
    ids = [f"{i}" for i in range(98)]
    ids[37], ids[80] = "bad-a", "bad-b"
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in ids:
            writer.submit_nowait(row(i))
        await writer.wait_drained()
        writer.submit_nowait(row("later"))  # nothing is stuck behind them
        await writer.wait_drained()
        nursery.cancel_scope.cancel()
    written = sorted(i for batch in sink.batches for i in batch)
    assert written == sorted(f"r{i}" for i in [*ids[:37], *ids[38:80], *ids[81:], "later"])
    dead = decode_rows(await trio.Path(folder / DEAD_LETTER_FILE).read_bytes())
    assert [r.request_id for r in dead] == ["rbad-a", "rbad-b"]
    stats = writer.statistics()
    assert (stats.written, stats.dead_lettered, stats.queued, stats.spilled) == (97, 2, 0, 0)
    # Bisection, not one insert per row: 98 rows, 2 bad, 2 × 2 × log2(98) + 2 attempts.
    assert sink.attempts <= 32
    assert not list(folder.glob("spill-*"))  # dead letters are never re-submitted


async def test_a_transient_failure_while_isolating_keeps_what_was_done(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    class FlakyPicky(PickySink):
        async def insert_spend_logs(self, rows: Sequence[SpendLogRow]) -> int:
            if self.attempts == 2:  # the third attempt: the database blinks
                self.attempts += 1
                raise StoreError("insert spend logs failed: OperationalError: gone")
            return await super().insert_spend_logs(rows)

    sink = FlakyPicky()
    writer = SpendLogWriter(sink, batch_rows=8, fallback_dir=tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in ["0", "1", "bad", "3", "4", "5", "6", "7"]:
            writer.submit_nowait(row(i))
        await writer.wait_drained()
        nursery.cancel_scope.cancel()
    written = [i for batch in sink.batches for i in batch]
    assert sorted(written) == sorted(f"r{i}" for i in "0134567")
    assert len(written) == len(set(written))
    assert writer.statistics().dead_lettered == 1


async def test_without_a_fallback_folder_a_refused_row_is_logged_and_dropped(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    sink = PickySink()
    writer = SpendLogWriter(sink)
    with caplog.at_level(logging.ERROR):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            writer.submit_nowait(row("bad"))
            writer.submit_nowait(row(1))
            await writer.wait_drained()
            nursery.cancel_scope.cancel()
    assert sink.batches == [["r1"]]
    assert "rbad refused by the database" in caplog.text


async def test_a_row_beyond_64_bits_survives_a_spill_file_exactly() -> None:
    huge = SpendLogRow(request_id="h", api="chat", cost_nanousd=2**70, user_id="a\x00b")
    (back,) = decode_rows(encode_rows([huge]))
    assert back == huge
