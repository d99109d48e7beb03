"""A request's governance settlement: one script per principal for budget and rate windows.

``budgets.settle`` and ``rate_limits.settle`` each declare one script call per principal.
A principal with both a budget and rate windows to settle (a key or a team with a budget
and RPM/TPM) would send two scripts, each with its own marker; :func:`settle` sends one:
``budget_settle.lua`` carries the principal's rate windows too (the work of
``rate_settle.lua``, guarded by the budget's marker). Principals with only one of the two
get the lone script, as before. Replies, idempotency by request id and the process-local
ledgers are the same; the Redis work per principal is one script call, one argument parse
and one marker (HSETNX + PAD) less.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.governance import budgets, rate_limits

if TYPE_CHECKING:
    from triogate.batch import Handle, PostCallBatch
    from triogate.governance.facts import RequestFacts


def settle(
    post: PostCallBatch,
    request: RequestFacts,
    *,
    budget_outcome: budgets.BudgetOutcome | None,
    rate_outcome: rate_limits.RateOutcome | None,
    actual_nanousd: int,
    actual_tokens: int,
    admitted: bool,
    now_ms: int,
) -> tuple[Handle[object], ...]:
    """Settle the request's budgets and rate windows on ``post`` (sync, never blocks).

    The arguments are those of ``budgets.settle`` and ``rate_limits.settle``; either
    outcome may be None (that check did not run).

    Raises:
        ValueError: negative amounts, or another request's outcome.
        BatchClosed: ``post`` is closed.
    """
    plans = {}
    if rate_outcome is not None:
        for plan in rate_limits.settle_plans(rate_outcome, request, actual_tokens=actual_tokens,
                                             admitted=admitted, now_ms=now_ms):
            plans[plan.kind, plan.id] = plan
    if any(plan.releases_slot for plan in plans.values()):
        post.hurry()  # a parallel slot the client's next request may wait for
    handles: tuple[Handle[object], ...] = ()
    if budget_outcome is not None:
        handles = budgets.settle(post, budget_outcome, request, actual_nanousd=actual_nanousd,
                                 now_ms=now_ms, rates=plans)
    return handles + rate_limits.declare(post, list(plans.values()))
