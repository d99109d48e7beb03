"""The spend-log writer against real SQLite and real PostgreSQL."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import sqlalchemy as sa
import trio

from triogate.store import SpendLogRow, SpendLogWriter, open_store
from triogate.store.spendlog import DEAD_LETTER_FILE, decode_rows

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from triogate.store import Store

    from .conftest import SqlTarget, TcpProxy

pytestmark = pytest.mark.integration


def row(i: int) -> SpendLogRow:
    return SpendLogRow(
        request_id=f"req-{i}",
        api="chat",
        key_hash="k",
        tags=("t",),
        cost_nanousd=1000 + i,
        start_time_ms=1_700_000_000_000 + i,
    )


async def stored_ids(store: Store) -> list[str]:
    rows, _ = await store.query_spend_logs(size=1000)
    return sorted(r.request_id for r in rows)


async def wait_until(predicate: Callable[[], bool], *, poll_s: float = 0.01) -> None:
    """Poll the writer's statistics (it has no event for "n failures so far")."""
    while not predicate():
        await trio.sleep(poll_s)


async def test_rows_are_written_in_batches_and_drained(store: Store, tmp_path: Path) -> None:
    writer = SpendLogWriter(store, interval_s=60.0, batch_rows=10, fallback_dir=tmp_path / "fb")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            for i in range(25):
                writer.submit_nowait(row(i))
            # Two full batches leave at once; the rest waits for its (long) interval.
            await wait_until(lambda: writer.statistics().batches == 2)
            assert len(await stored_ids(store)) == 20
            await writer.wait_drained()  # flushes the remainder now
            nursery.cancel_scope.cancel()
    assert await stored_ids(store) == sorted(f"req-{i}" for i in range(25))
    totals = await store.spend_totals(tag="t")
    assert totals.cost_nanousd == sum(1000 + i for i in range(25))
    stats = writer.statistics()
    assert (stats.written, stats.batches, stats.failures, stats.spilled) == (25, 3, 0, 0)
    assert not list((tmp_path / "fb").glob("*.jsonl"))


async def test_a_short_interval_writes_without_a_drain(store: Store) -> None:
    writer = SpendLogWriter(store, interval_s=0.05, batch_rows=500)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            writer.submit_nowait(row(1))
            await wait_until(lambda: writer.statistics().written == 1)
            nursery.cancel_scope.cancel()
    assert await stored_ids(store) == ["req-1"]


def _rename(store: Store, old: str, new: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"ALTER TABLE {old} RENAME TO {new}"))


async def test_writes_that_fail_are_retried_until_the_table_is_back(
    store: Store, sql_target: SqlTarget
) -> None:
    writer = SpendLogWriter(store, interval_s=0.02, min_backoff_s=0.01, max_backoff_s=0.05)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await trio.to_thread.run_sync(_rename, store, "spend_logs", "spend_logs_away")
            for i in range(5):
                writer.submit_nowait(row(i))
            await wait_until(lambda: writer.statistics().failures >= 3)
            writer.submit_nowait(row(5))
            assert writer.statistics().written == 0
            await trio.to_thread.run_sync(_rename, store, "spend_logs_away", "spend_logs")
            await writer.wait_drained()
            nursery.cancel_scope.cancel()
    assert await stored_ids(store) == [f"req-{i}" for i in range(6)]


async def test_writes_survive_postgres_going_away_and_coming_back(
    postgres_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    proxy, url = postgres_proxy
    with trio.fail_after(60):
        async with open_store(url, state_dir=tmp_path) as store:
            writer = SpendLogWriter(store, interval_s=0.02, min_backoff_s=0.01, max_backoff_s=0.1)
            async with trio.open_nursery() as nursery:
                await nursery.start(writer.run)
                writer.submit_nowait(row(0))
                await writer.wait_drained()
                proxy.down()
                for i in range(1, 4):
                    writer.submit_nowait(row(i))
                await wait_until(lambda: writer.statistics().failures >= 2)
                await proxy.up()
                await writer.wait_drained()
                nursery.cancel_scope.cancel()
            assert await stored_ids(store) == [f"req-{i}" for i in range(4)]


async def test_rows_spilled_on_cancellation_are_written_by_the_next_writer_once(
    store: Store, sql_target: SqlTarget, tmp_path: Path
) -> None:
    folder = tmp_path / "spendlog"
    with trio.fail_after(30):
        await store.insert_spend_logs([row(0)])  # already written: the replay must skip it
        await trio.to_thread.run_sync(_rename, store, "spend_logs", "spend_logs_away")
        first = SpendLogWriter(store, interval_s=0.02, min_backoff_s=0.01, fallback_dir=folder)
        async with trio.open_nursery() as nursery:
            await nursery.start(first.run)
            for i in range(4):
                first.submit_nowait(row(i))
            await wait_until(lambda: first.statistics().failures >= 2)
            with trio.move_on_after(0.2):
                await first.wait_drained()  # the grace period runs out
            nursery.cancel_scope.cancel()
        assert first.statistics().spilled == 4
        assert len(list(folder.glob("spill-*.jsonl"))) == 1
        await trio.to_thread.run_sync(_rename, store, "spend_logs_away", "spend_logs")

        # A new process on the same database and state folder.
        async with open_store(sql_target.url, state_dir=sql_target.state_dir) as again:
            second = SpendLogWriter(again, interval_s=0.02, fallback_dir=folder)
            async with trio.open_nursery() as nursery:
                await nursery.start(second.run)
                assert second.statistics().recovered == 4
                await second.wait_drained()
                nursery.cancel_scope.cancel()
    assert await stored_ids(store) == [f"req-{i}" for i in range(4)]
    assert list(folder.iterdir()) == []


async def test_a_row_the_database_refuses_does_not_stop_the_others(
    store: Store, sql_target: SqlTarget, tmp_path: Path
) -> None:
    """PostgreSQL refuses a NUL byte in text (SQLite takes it); both refuse an integer
    beyond 64 bits. Those rows are set aside; every other row is written."""
    folder = tmp_path / "spendlog"
    writer = SpendLogWriter(store, interval_s=0.02, batch_rows=50, fallback_dir=folder)
    nul = attrs.evolve(row(100), request_id="req-nul", user_id="a\x00b")
    huge = attrs.evolve(row(101), request_id="req-huge", cost_nanousd=2**70)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            for i in range(20):
                writer.submit_nowait(row(i))
            writer.submit_nowait(nul)
            for i in range(20, 40):
                writer.submit_nowait(row(i))
            writer.submit_nowait(huge)
            await writer.wait_drained()
            writer.submit_nowait(row(40))  # the queue is not stuck behind them
            await writer.wait_drained()
            nursery.cancel_scope.cancel()
    refused = ["req-huge", "req-nul"] if sql_target.dialect == "postgresql" else ["req-huge"]
    good = sorted([f"req-{i}" for i in range(41)] + (["req-nul"] if len(refused) == 1 else []))
    assert await stored_ids(store) == good
    dead = decode_rows(await trio.Path(folder / DEAD_LETTER_FILE).read_bytes())
    assert sorted(r.request_id for r in dead) == refused
    assert writer.statistics().dead_lettered == len(refused)
    assert writer.statistics().queued == 0


async def test_a_ping_keeps_its_deadline_when_postgres_hangs(
    postgres_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    """Readiness bounds its database check; a database that accepts and never answers
    (a silent network) must not hold it, nor pile up threads."""
    proxy, url = postgres_proxy
    with trio.fail_after(60):
        async with open_store(url, state_dir=tmp_path) as store:
            await store.ping()
            proxy.stall()
            for _ in range(3):
                with trio.move_on_after(0.5) as bounded:
                    await store.ping()
                assert bounded.cancelled_caught
            proxy.resume()
            while True:  # the abandoned probe finishes, then pings answer again
                with trio.move_on_after(1):
                    await store.ping()
                    break


async def test_statements_have_a_server_side_timeout(
    store: Store, sql_target: SqlTarget
) -> None:
    if sql_target.dialect != "postgresql":
        pytest.skip("statement_timeout is PostgreSQL's")

    def show() -> str:
        with store.engine.connect() as conn:
            return str(conn.execute(sa.text("SHOW statement_timeout")).scalar())

    assert await trio.to_thread.run_sync(show) == "30s"
    assert await trio.to_thread.run_sync(_search_path, store) == sql_target.schema


def _search_path(store: Store) -> str:
    with store.engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT current_schema()")).scalar())
