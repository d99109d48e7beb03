"""governance.admit: budgets and rate limits as one participant, one script per principal,
deciding exactly what the two participants decide."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from triogate.batch import CommandError, open_batch_scope
from triogate.batch.testing import FaultyBackend, RecordingBackend
from triogate.governance import admit
from triogate.governance.decisions import Allowed, Rejected
from triogate.governance.keys import budget_keys, principal_tag, rate_window_key
from triogate.governance.local import LocalGovernance
from triogate.governance.principals import Limits

from .support import identity, names, request, scripted, settings, split
from .test_participants import FULL, LIMITED, run_checks

if TYPE_CHECKING:
    from collections.abc import Callable

    from triogate.batch import Backend
    from triogate.governance import budgets, rate_limits
    from triogate.governance.principals import Identity

pytestmark = pytest.mark.usefixtures("autojump_clock")


async def run_merged(
    backend: Backend, who: Identity, *, req: object = None, check: object = None,
    local: LocalGovernance | None = None,
) -> tuple[budgets.BudgetOutcome, rate_limits.RateOutcome, int]:
    async with open_batch_scope({"counters": backend}) as scope:
        p = scope.start_participant(admit.admit, scope.batch, who, req or request(),
                                    check or settings(), local or LocalGovernance(),
                                    name="governance")
    b, r = p.result()
    return b, r, scope.statistics().rounds


async def test_one_script_per_principal_in_one_round() -> None:
    backend = RecordingBackend(respond=scripted())
    b, r, rounds = await run_merged(backend, identity(**FULL))  # type: ignore[arg-type]
    assert rounds == 1 and len(backend.pipelines) == 1
    calls = [split(w) for w in backend.pipelines[0]]
    # key and team: budget + windows in one call; end user: budget + parallel window; the
    # user: windows only; the first tag: budget only (the second has nothing).
    assert [name for name, _, _ in calls] == ["budget_reserve"] * 4 + ["rate_admit"]
    for _, keys, _ in calls:  # one principal's hash tag per call
        assert len({k[k.index("{"): k.index("}") + 1] for k in keys}) == 1, keys
    _, keys, args = calls[0]
    kid = "a" * 64
    period = FULL["key"].budget_period(request().now_ms)  # type: ignore[attr-defined]
    assert keys == [*budget_keys("key", kid, period).as_tuple(),
                    rate_window_key("key", kid, "rpm"), rate_window_key("key", kid, "tpm"),
                    rate_window_key("key", kid, "parallel"),
                    rate_window_key("key", kid, "rpm", "gpt-4o")]
    assert args[6:] == ["50", "r", "10", "t", "1000", "p", "2", "r", "3"]
    assert isinstance(b.decision, Allowed) and isinstance(r.decision, Allowed)


def over(*tags: str) -> set[str]:
    return {principal_tag(*t.split(":")) for t in tags}


SCENARIOS: list[tuple[str, Callable[[], Backend], Identity, object]] = [
    ("all admitted", lambda: RecordingBackend(respond=scripted()), identity(**FULL), None),  # type: ignore[arg-type]
    ("team over budget", lambda: RecordingBackend(respond=scripted(
        over_budget=over("team:ml"), spend=5)), identity(**FULL), None),  # type: ignore[arg-type]
    ("key rate limited", lambda: RecordingBackend(respond=scripted(
        rate_limited=over(f"key:{'a' * 64}"), retry_after_ms=12_500)),
     identity(**FULL), None),  # type: ignore[arg-type]
    ("both refuse at the key", lambda: RecordingBackend(respond=scripted(
        over_budget=over(f"key:{'a' * 64}"), rate_limited=over(f"key:{'a' * 64}"))),
     identity(key=Limits(max_budget_nanousd=1, rpm=1)), None),
    ("redis down, fail open", lambda: _down(), LIMITED, None),
    ("redis down, fail closed", lambda: _down(), LIMITED,
     settings(budgets_policy="fail-closed", rate_limits_policy="fail-closed")),
    ("an error reply", lambda: RecordingBackend(
        respond=lambda wire: CommandError("WRONGTYPE bad key")), LIMITED, None),
    ("an unexpected reply", lambda: RecordingBackend(respond=lambda wire: [1, 2]), LIMITED,
     None),
]


def _down() -> FaultyBackend:
    backend = FaultyBackend(RecordingBackend(respond=scripted()))
    backend.down = True
    return backend


@pytest.mark.parametrize(("backend", "who", "check"), [s[1:] for s in SCENARIOS],
                         ids=[s[0] for s in SCENARIOS])
async def test_the_same_decisions_as_the_two_participants(
    backend: Callable[[], Backend], who: Identity, check: object,
) -> None:
    b1, r1, _ = await run_checks(backend(), who, check=check, dummy=False)
    b2, r2, _ = await run_merged(backend(), who, check=check)
    assert (b2.decision, b2.reservation, b2.remaining_nanousd) == (
        b1.decision, b1.reservation, b1.remaining_nanousd)
    assert (r2.decision, r2.admission) == (r1.decision, r1.admission)


def refusing(part: str) -> Callable[[tuple[object, ...]], object]:
    """budget_reserve with windows, one part refused: its element is an error reply."""
    play = scripted()

    def respond(wire: tuple[object, ...]) -> object:
        reply = play(wire)
        assert isinstance(reply, list)
        error = CommandError(f"ERR {part}: expected ...")
        return [error, *reply[3:]] if part == "budget_reserve" else [*reply[:3], error]

    return respond


@pytest.mark.parametrize(("part", "check"), [("budget_reserve", "budgets"),
                                             ("rate_admit", "rate_limits")])
async def test_a_refused_part_fails_only_its_own_check(part: str, check: str) -> None:
    who = identity(key=Limits(max_budget_nanousd=10**9, rpm=10))
    b, r, _ = await run_merged(RecordingBackend(respond=refusing(part)), who)
    refused, other = (b, r) if check == "budgets" else (r, b)
    assert isinstance(refused.decision, Rejected)
    assert (refused.decision.check, refused.decision.status) == (check, 500)
    assert isinstance(other.decision, Allowed) and not other.decision.degraded


async def test_a_merged_call_declares_nothing_for_the_master_key() -> None:
    backend = RecordingBackend(respond=scripted())
    b, r, rounds = await run_merged(backend, identity(master=True, **FULL))  # type: ignore[arg-type]
    assert (backend.pipelines, rounds) == ([], 0)
    assert (b.decision, b.reservation, r.decision, r.admission) == (
        Allowed(), None, Allowed(), None)
    assert names(backend) == []
