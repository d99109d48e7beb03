"""The spend page's queries against a real SQLite store: filters, paging, daily sums."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from triogate.store import SpendLogRow, open_store
from triogate.ui import reports
from triogate.ui.reports import LogFilter

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from triogate.store import Store

DAY_MS = reports.MS_PER_DAY
T0 = 1_796_000_000_000 - 1_796_000_000_000 % DAY_MS  # a UTC midnight


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(None, state_dir=tmp_path) as s:
        yield s


def _row(n: int, **kw: object) -> SpendLogRow:
    fields: dict[str, object] = {"request_id": f"r{n}", "api": "chat", "model_group": "m",
                                 "cost_nanousd": 1_000, "start_time_ms": T0 + n,
                                 "end_time_ms": T0 + n + 5}
    fields.update(kw)
    return SpendLogRow(**fields)  # type: ignore[arg-type]


async def test_daily_sums_keep_rows_without_the_group(store: Store) -> None:
    # A team's request and a request with no team on the same day (the spend page once
    # failed sorting None against a name).
    await store.insert_spend_logs([
        _row(1, team_id="payments", cost_nanousd=3_000),
        _row(2, team_id=None, cost_nanousd=5_000),
        _row(3, team_id="payments", cost_nanousd=4_000, start_time_ms=T0 + DAY_MS + 1),
        _row(4, user_id=None, tags=("a", "b"), cost_nanousd=7_000)])
    rows = await reports.daily(store, LogFilter(), group_by="team")
    day0 = reports.day_range(T0, 1)[0]
    day1 = reports.day_range(T0 + DAY_MS, 1)[0]
    assert rows == [(day0, "payments", 1, 3_000), (day0, None, 2, 12_000),
                    (day1, "payments", 1, 4_000)]
    assert await reports.daily(store, LogFilter(), group_by="user") == [
        (day0, None, 3, 15_000), (day1, None, 1, 4_000)]
    assert await reports.daily(store, LogFilter(), group_by="tag") == [
        (day0, "a", 1, 7_000), (day0, "b", 1, 7_000)]
    with pytest.raises(ValueError, match="group_by"):
        await reports.daily(store, LogFilter(), group_by="colour")


async def test_log_filters_and_paging(store: Store) -> None:
    await store.insert_spend_logs([
        _row(1, key_hash="k1", status="success", cache_hit=True, tags=("t",)),
        _row(2, key_hash="k1", status="error", model_group="other"),
        _row(3, key_hash="k2", user_id="u", end_user="c"),
        *[_row(10 + i, key_hash="k3") for i in range(5)]])
    async def ids(f: LogFilter, page: int = 1, size: int = 50) -> tuple[list[str], int]:
        rows, total = await reports.log_page(store, f, page=page, size=size)
        return [r.request_id for r in rows], total
    assert await ids(LogFilter(key_hash="k1")) == (["r2", "r1"], 2)
    assert await ids(LogFilter(status="error")) == (["r2"], 1)
    assert await ids(LogFilter(cache_hit=True)) == (["r1"], 1)
    assert await ids(LogFilter(cache_hit=False, key_hash="k1")) == (["r2"], 1)
    assert await ids(LogFilter(model_group="other")) == (["r2"], 1)
    assert await ids(LogFilter(tag="t")) == (["r1"], 1)
    assert await ids(LogFilter(user_id="u")) == (["r3"], 1)
    assert await ids(LogFilter(end_user="c")) == (["r3"], 1)
    assert await ids(LogFilter(start_ms=T0 + 3, end_ms=T0 + 12)) == (["r11", "r10", "r3"], 3)
    # Newest first, pages of 3: 8 rows make pages of 3, 3 and 2.
    assert await ids(LogFilter(), page=1, size=3) == (["r14", "r13", "r12"], 8)
    assert await ids(LogFilter(), page=3, size=3) == (["r2", "r1"], 8)
    assert await reports.total(store, LogFilter(key_hash="k3")) == (5, 0, 5_000)
