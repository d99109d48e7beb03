"""Spend-log inserts into SQLite keep the process's memory bounded.

Before: each batch size gave its own multi-row ``INSERT ... RETURNING`` text, every text
stayed prepared in the connection's statement cache (128 per connection) holding its
last bound batch, tags included: SQLite's own allocations grew with every new batch
size, and malloc_trim could not give them back (they were live).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa
import trio

from triogate.store import SpendLogRow, open_store

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.integration

TAGS = tuple(f"team-cost-centre-{i:02d}" for i in range(32))  # the most a request may carry


def _rows(ids: itertools.count[int], n: int) -> list[SpendLogRow]:
    return [SpendLogRow(request_id=f"r{next(ids)}", api="chat", key_hash="k" * 64, tags=TAGS,
                        start_time_ms=1_700_000_000_000) for _ in range(n)]


def _sqlite_memory_used() -> Callable[[], int] | None:
    """SQLite's ``sqlite3_memory_used`` of the library the sqlite3 module uses, or None
    when that is not a shared libsqlite3 loaded in this process (linked statically)."""
    import sqlite3  # noqa: F401 (loads the library this test reads the counter of)

    maps = Path("/proc/self/maps")
    name = ctypes.util.find_library("sqlite3")
    if name is None or not maps.exists() or "libsqlite3" not in maps.read_text():
        return None
    lib = ctypes.CDLL(name)  # the same handle: dlopen of a loaded library
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return lib.sqlite3_memory_used  # type: ignore[no-any-return]


async def test_batches_of_every_size_share_one_insert_text(tmp_path: Path) -> None:
    texts: set[str] = set()
    with trio.fail_after(60):
        async with open_store(None, state_dir=tmp_path) as store:
            def seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
                if statement.startswith("INSERT"):
                    texts.add(statement)

            sa.event.listen(store.engine, "before_cursor_execute", seen)
            ids = itertools.count()
            for size in range(1, 41):
                assert await store.insert_spend_logs(_rows(ids, size)) == size
            assert await store.insert_spend_logs(_rows(itertools.count(), 40)) == 0  # replay
    # One text for spend_logs, one for spend_log_tags (was 41 for spend_logs).
    assert len(texts) == 2, sorted(t[:60] for t in texts)


async def test_sqlite_memory_stays_bounded_over_many_batch_sizes(tmp_path: Path) -> None:
    memory_used = _sqlite_memory_used()
    if memory_used is None:
        pytest.skip("the sqlite3 module's SQLite is not a shared libsqlite3")
    with trio.fail_after(120):
        async with open_store(None, state_dir=tmp_path) as store:
            ids = itertools.count()
            await store.insert_spend_logs(_rows(ids, 100))
            before = memory_used()
            for size in range(101, 161):  # 60 new batch sizes, ~7,800 rows of 32 tags
                await store.insert_spend_logs(_rows(ids, size))
            grown = memory_used() - before
    # Measured: 1.4 MiB (the page cache filling); 24.6 MiB with the RETURNING texts.
    assert grown < 4 << 20, f"SQLite allocations grew by {grown >> 10} KiB"
