"""The round-trip harness holds the project to its figures: run it, check its data.

One traced request per shape (the harness's own warm-up comes first), against real
gateways on loopback, a private embedded server and real SQLite.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import orjson
import pytest
import trio

from triogate.batch import AFTER, BEFORE
from triogate.bench.roundtrips import SHAPES, main, run_roundtrips

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.bench.report import RoundTripReport

pytestmark = pytest.mark.integration

#: What governance declares before the model call with every row of the table: key, team
#: and end user each have a budget and rate limits, one script each (governance/admit.py).
GOVERNED = Counter({"budgets": 3, "routing": 1})


@pytest.fixture
async def report(tmp_path: Path) -> RoundTripReport:
    with trio.fail_after(120):
        return await run_roundtrips(requests=1, work_dir=tmp_path)


def before_owners(report: RoundTripReport, name: str) -> Counter[str]:
    (result,) = [r for r in report.results if r.name == name]
    return Counter(o for rnd in result.requests[0].phase(BEFORE) for o in rnd.owners)


async def test_every_cached_identity_shape_waits_once_before_and_once_after(
    report: RoundTripReport,
) -> None:
    cached = [r for r in report.results if not r.refresh]
    assert len(cached) == 7
    for result in cached:
        assert [(t.waits_before, t.waits_after) for t in result.requests] == [(1, 1)], result.name
        owners = before_owners(report, result.name)
        # Governance really ran in that one wait, and auth needed no Redis at all.
        assert owners & GOVERNED == GOVERNED, result.name
        assert "auth" not in owners, result.name


async def test_refresh_shapes_wait_at_most_three_times_and_really_refresh(
    report: RoundTripReport,
) -> None:
    refreshed = [r for r in report.results if r.refresh]
    assert len(refreshed) == 2
    for result in refreshed:
        (trace,) = result.requests
        assert trace.waits <= 3, result.name
        assert trace.waits_after == 1, result.name
        assert "auth" in before_owners(report, result.name), result.name


async def test_a_cache_hit_waits_once_each_side_and_misses_read_the_cache(
    report: RoundTripReport,
) -> None:
    for result in report.results:
        (trace,) = result.requests
        assert trace.cache == ("hit" if result.cache_hit else "miss"), result.name
        assert "cache" in before_owners(report, result.name), result.name
        after = Counter(o for rnd in trace.phase(AFTER) for o in rnd.owners)
        # A miss stores its answer after the call; a hit has nothing to store.
        assert ("cache" in after) is not result.cache_hit, result.name
    (hit,) = [r for r in report.results if r.cache_hit]
    assert [(t.waits_before, t.waits_after) for t in hit.requests] == [(1, 1)]


async def test_the_table_names_every_shape_and_no_budget_is_exceeded(
    report: RoundTripReport,
) -> None:
    table = report.markdown()
    for shape in SHAPES:
        assert f"| {shape.name} |" in table
    assert report.budget_violations() == []
    assert [r.name for r in report.results] == [s.name for s in SHAPES]


def test_the_command_writes_the_table_and_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--requests", "1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert printed == (tmp_path / "roundtrips.md").read_text()
    data = orjson.loads((tmp_path / "roundtrips.json").read_bytes())
    assert [s["name"] for s in data["shapes"]] == [s.name for s in SHAPES]
    assert all(len(s["requests"]) == 1 for s in data["shapes"])
    assert data["budget_violations"] == []


async def test_proxy_and_model_budgets_are_two_more_scripts_of_the_same_round(
    report: RoundTripReport,
) -> None:
    owners = before_owners(report, "chat completion, proxy budget + model budget + "
                                   "pre-call guardrail")
    # The key's budget for the group and the proxy's: two more scripts, no more waits
    # (the first test); the guardrail declares nothing.
    assert owners == GOVERNED + Counter({"budgets": 2}) + Counter({"cache": 1})
