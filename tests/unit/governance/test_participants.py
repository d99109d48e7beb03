"""Budgets and rate limits as batch participants: declarations, rounds, decisions, policies."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from triogate.batch import Batch, CommandError, Settler, open_batch_scope, open_post_call_batch
from triogate.batch.testing import FaultyBackend, RecordingBackend
from triogate.governance import budgets, rate_limits
from triogate.governance.decisions import Allowed, Rejected, first_rejected
from triogate.governance.keys import MARKER_SLICE_MS, budget_keys, principal_tag, rate_window_key
from triogate.governance.local import LocalGovernance
from triogate.governance.principals import Limits
from triogate.governance.settle import settle as settle_together

from .support import NOW_MS, identity, names, request, scripted, settings, split

if TYPE_CHECKING:
    from triogate.batch import Backend
    from triogate.governance.principals import Identity

pytestmark = pytest.mark.usefixtures("autojump_clock")


async def run_checks(
    backend: Backend,
    who: Identity,
    *,
    req: object = None,
    check: object = None,
    local: LocalGovernance | None = None,
    dummy: bool = True,
) -> tuple[budgets.BudgetOutcome, rate_limits.RateOutcome, int]:
    """Both participants (and a cache-like GET) in one scope, as the handler starts them."""
    local = local or LocalGovernance()
    req = req or request()
    check = check or settings()

    async def cache(batch: Batch) -> object:
        return await batch.call("GET", keys=["tg:{cache}:x"], backend="counters", owner="cache")

    async with open_batch_scope({"counters": backend}) as scope:
        b = scope.start_participant(budgets.reserve, scope.batch, who, req, check, local,
                                    name="budgets")
        r = scope.start_participant(rate_limits.admit, scope.batch, who, req, check, local,
                                    name="rate_limits")
        if dummy:
            scope.start_participant(cache, scope.batch, name="cache")
    return b.result(), r.result(), scope.statistics().rounds


FULL = dict(
    key=Limits(max_budget_nanousd=10**9, rpm=10, tpm=1000, max_parallel=2),
    team=Limits(max_budget_nanousd=10**10, rpm=100),
    user=Limits(tpm=5000),
    end_user=Limits(max_budget_nanousd=10**8, max_parallel=1),
    tags=(Limits(max_budget_nanousd=10**9), Limits()),
    model_rpm={"gpt-4o": 3},
    model_tpm={"other": 9},
)


async def test_both_participants_and_a_third_share_one_round() -> None:
    backend = RecordingBackend(respond=scripted())
    b, r, rounds = await run_checks(backend, identity(**FULL))  # type: ignore[arg-type]
    assert rounds == 1
    assert len(backend.pipelines) == 1
    counted = names(backend)[0]
    # Budgets: key, team, end user, first tag (the second tag has no budget).
    assert counted.count("budget_reserve") == 4
    # Rate limits: key, team, user, end user (the tags have no rate limits).
    assert counted.count("rate_admit") == 4
    assert counted.count("GET") == 1
    assert len(counted) == 9
    assert isinstance(b.decision, Allowed) and isinstance(r.decision, Allowed)


async def test_each_script_call_stays_in_one_principal_hash_tag() -> None:
    backend = RecordingBackend(respond=scripted())
    await run_checks(backend, identity(**FULL), dummy=False)  # type: ignore[arg-type]
    for wire in backend.pipelines[0]:
        _, keys, _ = split(wire)
        tags = {k[k.index("{"): k.index("}") + 1] for k in keys}
        assert len(tags) == 1, keys


async def test_budget_reserve_declares_the_period_keys_and_arguments() -> None:
    backend = RecordingBackend(respond=scripted())
    limits = Limits(max_budget_nanousd=5_000, budget_duration_s=86_400, budget_anchor_s=0)
    req = request(estimate_nanousd=1_234)
    await run_checks(backend, identity(key=limits), req=req, check=settings(lease_ms=9_000),
                     dummy=False)
    ((name, keys, args),) = [split(w) for w in backend.pipelines[0]]
    period = limits.budget_period(NOW_MS)
    end_ms = limits.budget_period_end_ms(NOW_MS)
    assert end_ms is not None
    assert name == "budget_reserve"
    assert keys == list(budget_keys("key", "a" * 64, period).as_tuple())
    ttl_ms = end_ms - NOW_MS + settings().budget_retention_ms
    assert args == [str(NOW_MS), "req-1", "1234", "5000", "9000", str(ttl_ms)]


async def test_rate_admit_declares_every_window_of_a_principal_in_one_call() -> None:
    backend = RecordingBackend(respond=scripted())
    who = identity(key=Limits(rpm=10, tpm=1000, max_parallel=2), model_rpm={"gpt-4o": 3},
                   model_tpm={"gpt-4o": 300, "other": 9})
    out = await run_checks(backend, who, check=settings(lease_ms=7_000), dummy=False)
    ((name, keys, args),) = [split(w) for w in backend.pipelines[0]]
    kid = "a" * 64
    assert name == "rate_admit"
    assert keys == [
        rate_window_key("key", kid, "rpm"),
        rate_window_key("key", kid, "tpm"),
        rate_window_key("key", kid, "parallel"),
        rate_window_key("key", kid, "rpm", "gpt-4o"),
        rate_window_key("key", kid, "tpm", "gpt-4o"),
    ]
    assert args == [str(NOW_MS), "req-1", "50", "7000", "r", "10", "t", "1000", "p", "2",
                    "r", "3", "t", "300"]
    decision = out[1].decision
    assert isinstance(decision, Allowed)
    # The most constrained windows: the model's (3 - 1 left, 300 - 1 left).
    assert decision.headers == {
        "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-tokens": "299",
        "x-ratelimit-limit-tokens": "300",
    }


@pytest.mark.parametrize("who", [identity(master=True, **FULL), identity()])  # type: ignore[arg-type]
async def test_nothing_to_check_sends_nothing(who: Identity) -> None:
    backend = RecordingBackend(respond=scripted())
    b, r, rounds = await run_checks(backend, who, dummy=False)
    assert backend.pipelines == []
    assert rounds == 0
    assert (b.decision, b.reservation) == (Allowed(), None)
    assert (r.decision, r.admission) == (Allowed(), None)


async def test_budget_rejection_names_the_principal_and_its_reset() -> None:
    backend = RecordingBackend(respond=scripted(over_budget={principal_tag("team", "ml")},
                                                spend=10 * 10**9))
    team = Limits(max_budget_nanousd=10 * 10**9, budget_duration_s=30 * 86_400,
                  budget_anchor_s=NOW_MS // 1000 - 86_400)
    b, _, _ = await run_checks(backend, identity(key=Limits(max_budget_nanousd=10**12),
                                                 team=team))
    end_ms = team.budget_period_end_ms(NOW_MS)
    assert end_ms == (NOW_MS // 1000 + 29 * 86_400) * 1000
    assert b.decision == Rejected(
        check="budgets",
        reason="budget_exceeded",
        message="Budget has been exceeded! Team 'ml': spend $10 of $10 in this "
        "period; resets 2026-10-20T14:13:20Z",
        status=400,
        error_type="budget_exceeded",
    )
    # The key's reservation was made and is carried for settlement; the team's was not.
    assert b.reservation is not None
    assert [(h.kind, h.settle_needed) for h in b.reservation.holds] == [
        ("key", True), ("team", False),
    ]


async def test_budget_rejection_of_a_large_estimate_says_what_it_may_cost() -> None:
    backend = RecordingBackend(respond=scripted(over_budget={principal_tag("key", "a" * 64)},
                                                spend=999_000_000))
    b, _, _ = await run_checks(
        backend, identity(key=Limits(max_budget_nanousd=10**9)),
        req=request(estimate_nanousd=5_000_000),
    )
    assert isinstance(b.decision, Rejected)
    assert b.decision.message == (
        "Budget has been exceeded! Key 'sk-alias': spend $0.999 of $1 in this period; "
        "this request may cost up to $0.005; lifetime budget"
    )


async def test_a_tiny_budget_is_printed_with_its_significant_digits() -> None:
    backend = RecordingBackend(respond=scripted(over_budget={principal_tag("key", "a" * 64)},
                                                spend=100))
    b, _, _ = await run_checks(backend, identity(key=Limits(max_budget_nanousd=100)),
                               req=request(estimate_nanousd=1))
    assert isinstance(b.decision, Rejected)
    assert b.decision.message.startswith(
        "Budget has been exceeded! Key 'sk-alias': spend $0.0000001 of $0.0000001 ")


async def test_rate_rejection_carries_retry_after_and_headers() -> None:
    backend = RecordingBackend(
        respond=scripted(rate_limited={principal_tag("user", "u1")}, retry_after_ms=12_500)
    )
    _, r, _ = await run_checks(backend, identity(key=Limits(rpm=50), user=Limits(rpm=20)))
    assert isinstance(r.decision, Rejected)
    assert (r.decision.check, r.decision.status, r.decision.error_type) == (
        "rate_limits", 429, "rate_limit_error",
    )
    assert r.decision.retry_after_s == 12.5
    assert r.decision.message == (
        "Rate limit exceeded for user 'u1': 20 requests per minute (retry after 12.5 s)"
    )
    assert r.decision.headers == {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-limit-requests": "20",
    }
    assert r.admission is not None
    assert [(e.kind, e.counted) for e in r.admission.entries] == [("key", True), ("user", False)]


async def test_budget_rejection_wins_over_rate_rejection() -> None:
    backend = RecordingBackend(respond=scripted(
        over_budget={principal_tag("key", "a" * 64)},
        rate_limited={principal_tag("key", "a" * 64)},
    ))
    b, r, _ = await run_checks(backend, identity(key=Limits(max_budget_nanousd=1, rpm=1)))
    assert isinstance(b.decision, Rejected) and isinstance(r.decision, Rejected)
    assert first_rejected([r.decision, b.decision]) is b.decision


# --------------------------------------------------------------------------- policies


def down() -> FaultyBackend:
    backend = FaultyBackend(RecordingBackend(respond=scripted()))
    backend.down = True
    return backend


LIMITED = identity(key=Limits(max_budget_nanousd=10**9, rpm=2, max_parallel=5))


async def test_fail_open_decides_locally_and_says_degraded() -> None:
    local = LocalGovernance()
    outcomes = [await run_checks(down(), LIMITED, req=request(f"r{i}"), local=local)
                for i in range(3)]
    decisions = [(b.decision, r.decision) for b, r, _ in outcomes]
    assert all(isinstance(b, Allowed) and b.degraded for b, _ in decisions)
    # The local window allows 2 requests per minute, as Redis would.
    assert [type(r).__name__ for _, r in decisions] == ["Allowed", "Allowed", "Rejected"]
    assert all(r.degraded for _, r in decisions)
    rejected = decisions[2][1]
    assert isinstance(rejected, Rejected) and rejected.status == 429


async def test_fail_open_still_refuses_a_principal_known_to_be_over_budget() -> None:
    local = LocalGovernance()
    who = identity(team=Limits(max_budget_nanousd=10**9))
    # Redis is up: the reply tells this process the team has spent its budget.
    up = RecordingBackend(respond=scripted(over_budget={principal_tag("team", "ml")},
                                           spend=10**9))
    b, _, _ = await run_checks(up, who, local=local)
    assert isinstance(b.decision, Rejected) and not b.decision.degraded
    # Redis goes down: the local ledger still refuses.
    b, _, _ = await run_checks(down(), who, req=request("r2"), local=local)
    assert isinstance(b.decision, Rejected)
    assert (b.decision.reason, b.decision.degraded) == ("budget_exceeded", True)
    # A principal the process knows nothing bad about is admitted, degraded.
    b, _, _ = await run_checks(down(), identity(team=Limits(max_budget_nanousd=10**9)),
                               req=request("r3"), local=LocalGovernance())
    assert b.decision == Allowed(degraded=True)


async def test_fail_open_learns_spend_from_settlements() -> None:
    local = LocalGovernance()
    who = identity(key=Limits(max_budget_nanousd=10_000))
    settler = Settler({"counters": RecordingBackend()})
    b, _, _ = await run_checks(down(), who, req=request("r1", estimate_nanousd=100), local=local)
    assert b.decision == Allowed(degraded=True)
    async with open_post_call_batch(settler, trace_id="r1") as post:
        budgets.settle(post, b, request("r1"), actual_nanousd=10_000, now_ms=NOW_MS)
    b, _, _ = await run_checks(down(), who, req=request("r2", estimate_nanousd=1), local=local)
    assert isinstance(b.decision, Rejected) and b.decision.degraded


async def test_fail_closed_refuses_with_503() -> None:
    check = settings(budgets_policy="fail-closed", rate_limits_policy="fail-closed")
    b, r, _ = await run_checks(down(), LIMITED, check=check)
    for decision, name in ((b.decision, "budgets"), (r.decision, "rate_limits")):
        assert isinstance(decision, Rejected)
        assert (decision.check, decision.status, decision.error_type, decision.reason,
                decision.degraded) == (name, 503, "service_unavailable", "redis_unavailable",
                                       True)


async def test_an_error_reply_is_treated_like_an_unreachable_redis() -> None:
    backend = RecordingBackend(respond=lambda wire: CommandError("WRONGTYPE bad key"))
    b, r, _ = await run_checks(backend, LIMITED, dummy=False)
    assert b.decision == Allowed(degraded=True)
    assert isinstance(r.decision, Allowed) and r.decision.degraded


# --------------------------------------------------------------------------- settlement


async def settle_both(
    b: budgets.BudgetOutcome, r: rate_limits.RateOutcome, *, actual_nanousd: int,
    actual_tokens: int, admitted: bool, req: object = None,
) -> list[tuple[str, list[str], list[str]]]:
    settler = Settler({"counters": RecordingBackend()})
    req = req or request()
    async with open_post_call_batch(settler, trace_id="t") as post:
        budgets.settle(post, b, req, actual_nanousd=actual_nanousd, now_ms=NOW_MS + 5_000)  # type: ignore[arg-type]
        rate_limits.settle(post, r, req, actual_tokens=actual_tokens, admitted=admitted,  # type: ignore[arg-type]
                           now_ms=NOW_MS + 5_000)
    return [split(c.wire()) for c in post.commands]


async def test_settle_after_success_declares_one_idempotent_call_per_principal() -> None:
    backend = RecordingBackend(respond=scripted())
    b, r, _ = await run_checks(backend, identity(**FULL))  # type: ignore[arg-type]
    calls = await settle_both(b, r, actual_nanousd=777, actual_tokens=80, admitted=True)
    # The team has only an RPM window: an admitted request changes nothing there, so it
    # gets no rate_settle (key: TPM + slot, user: TPM, end user: slot).
    assert [c[0] for c in calls] == ["budget_settle"] * 4 + ["rate_settle"] * 3
    assert not any(name == "rate_settle" and "team:" in keys[0] for name, keys, _ in calls)
    for name, keys, args in calls:
        # the markers HASH of the settlement's minute, in the principal's tag (the request
        # id is its field)
        assert keys[-1].endswith(f":done:{(NOW_MS + 5_000) // MARKER_SLICE_MS}")
        assert keys[-1].split("}")[0] == keys[0].split("}")[0]
        if name == "budget_settle":
            assert args[:2] == ["req-1", "777"]
        else:
            assert args[:6] == ["req-1", "a", str(NOW_MS // 1000), "50", "80",
                                str(NOW_MS + 5_000)]


async def test_settle_together_sends_one_script_per_principal() -> None:
    """governance.settle: a principal with a budget and rate windows to settle gets ONE
    budget_settle carrying its windows (after its budget arguments, rate_settle's mode ..
    now_ms and the kinds); principals with only one of the two get the lone script, with
    the same arguments as before. Every key of a call in the principal's tag."""
    backend = RecordingBackend(respond=scripted())
    b, r, _ = await run_checks(backend, identity(**FULL))  # type: ignore[arg-type]
    alone = await settle_both(b, r, actual_nanousd=777, actual_tokens=80, admitted=True)
    settler = Settler({"counters": RecordingBackend()})
    req = request()
    async with open_post_call_batch(settler, trace_id="t") as post:
        handles = settle_together(post, req, budget_outcome=b, rate_outcome=r,  # type: ignore[arg-type]
                                  actual_nanousd=777, actual_tokens=80, admitted=True,
                                  now_ms=NOW_MS + 5_000)
    together = [split(c.wire()) for c in post.commands]
    assert len(handles) == len(together)
    # key: budget + TPM + slot; end user: budget + slot -> merged. user: TPM only -> alone.
    # team: budget (its RPM needs nothing) and the tag: budget only -> budget_settle alone.
    assert [c[0] for c in together] == ["budget_settle"] * 4 + ["rate_settle"]
    lone_budget = {k[0]: (k, a) for n, k, a in alone if n == "budget_settle"}
    lone_rate = {k[0].split("}")[0]: (k, a) for n, k, a in alone if n == "rate_settle"}
    merged = 0
    for name, keys, args in together:
        assert {k.split("}")[0] for k in keys} == {keys[0].split("}")[0]}
        if name == "rate_settle":
            assert (keys, args) == lone_rate[keys[0].split("}")[0]]
            continue
        budget_keys_, budget_args = lone_budget[keys[0]]
        assert keys[:4] == budget_keys_ and args[:4] == budget_args
        rate = lone_rate.get(keys[0].split("}")[0])
        if rate is None:
            assert len(keys) == 4 and len(args) == 4
            continue
        merged += 1
        rate_keys, rate_args = rate
        assert keys[4:] == rate_keys[:-1]  # its windows, not its own marker
        # rate_settle: request id, mode .. now_ms, marker TTL, kinds
        assert args[4:] == rate_args[1:6] + rate_args[7:]
    assert merged == 2


async def test_settle_skips_principals_with_nothing_to_change() -> None:
    """Admitted, no parallel slot and the actual tokens equal to the estimate: no script
    at all for the rate windows (an RPM count stands; a TPM reservation is exact)."""
    backend = RecordingBackend(respond=scripted())
    who = identity(key=Limits(rpm=10, tpm=1000), team=Limits(rpm=100))
    b, r, _ = await run_checks(backend, who)
    exact = await settle_both(b, r, actual_nanousd=0, actual_tokens=50, admitted=True)
    assert exact == []
    corrected = await settle_both(b, r, actual_nanousd=0, actual_tokens=51, admitted=True)
    assert [(n, a[1]) for n, _, a in corrected] == [("rate_settle", "a")]
    undone = await settle_both(b, r, actual_nanousd=0, actual_tokens=0, admitted=False)
    assert [(n, a[1]) for n, _, a in undone] == [("rate_settle", "u")] * 2


async def test_settle_after_a_rejection_undoes_only_what_was_counted() -> None:
    backend = RecordingBackend(respond=scripted(
        over_budget={principal_tag("team", "ml")}, rate_limited={principal_tag("team", "ml")},
    ))
    who = identity(key=Limits(max_budget_nanousd=10**9, rpm=5),
                   team=Limits(max_budget_nanousd=10**9, rpm=5))
    b, r, _ = await run_checks(backend, who)
    calls = await settle_both(b, r, actual_nanousd=0, actual_tokens=0, admitted=False)
    # Only the key had reserved and counted; the team changed nothing, so nothing to undo.
    assert [(n, k[0][k[0].index("{"):k[0].index("}") + 1], a[1]) for n, k, a in calls] == [
        ("budget_settle", "{key:" + "a" * 64 + "}", "0"),
        ("rate_settle", "{key:" + "a" * 64 + "}", "u"),
    ]


async def test_rate_rejection_settles_as_not_admitted_whatever_the_caller_says() -> None:
    backend = RecordingBackend(respond=scripted(rate_limited={principal_tag("user", "u1")}))
    _, r, _ = await run_checks(backend, identity(key=Limits(rpm=5), user=Limits(rpm=1)))
    calls = await settle_both(budgets.BudgetOutcome(decision=Allowed()), r, actual_nanousd=0,
                              actual_tokens=0, admitted=True)
    assert [(n, a[1]) for n, _, a in calls] == [("rate_settle", "u")]


async def test_degraded_admission_settles_by_releasing_the_slot_only() -> None:
    b, r, _ = await run_checks(down(), LIMITED)
    calls = await settle_both(b, r, actual_nanousd=300, actual_tokens=10, admitted=True)
    assert [(n, a[1]) for n, _, a in calls] == [("budget_settle", "300"), ("rate_settle", "x")]


async def test_settle_refuses_another_requests_outcome() -> None:
    backend = RecordingBackend(respond=scripted())
    b, r, _ = await run_checks(backend, LIMITED)
    settler = Settler({"counters": RecordingBackend()})
    async with open_post_call_batch(settler, trace_id="t") as post:
        with pytest.raises(ValueError, match="another request"):
            budgets.settle(post, b, request("other"), actual_nanousd=0, now_ms=NOW_MS)
        with pytest.raises(ValueError, match="another request"):
            rate_limits.settle(post, r, request("other"), actual_tokens=0, admitted=True,
                               now_ms=NOW_MS)
        with pytest.raises(ValueError, match=">= 0"):
            budgets.settle(post, b, request(), actual_nanousd=-1, now_ms=NOW_MS)


async def test_outcomes_without_anything_to_settle_declare_nothing() -> None:
    calls = await settle_both(budgets.BudgetOutcome(decision=Allowed()),
                              rate_limits.RateOutcome(decision=Allowed()),
                              actual_nanousd=5, actual_tokens=5, admitted=True)
    assert calls == []
