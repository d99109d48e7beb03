"""A request's governance admission: one script per principal for its budget and rate windows.

``budgets.reserve`` and ``rate_limits.admit`` each declare one script call per principal.
A principal with both a budget and rate windows (a key or a team with a budget and
RPM/TPM, an end user with a budget and RPM) would send two scripts; :func:`admit` sends
one: ``budget_reserve.lua`` carries the principal's rate windows too (the work of
``rate_admit.lua``), and its reply holds both scripts' replies, one after the other.
Principals with only one of the two get the lone script, as before. Each part is read by
the code that read its lone script's reply (``budgets.conclude``, ``rate_limits.conclude``),
so decisions, messages, headers, the process-local ledgers and the fail-open/fail-closed
policies are the same; the Redis work per such principal is one script call, one argument
parse, one TIME and one reply less (the mirror of ``governance.settle`` after the call).

Failure: an error of the whole call (Redis unreachable, an error raised inside the script)
is both parts' error, as it would have been for two calls of one pipeline that failed as a
whole; a part whose arguments the script refuses is that part's own error reply, nested in
the array (the other part ran as it would have alone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

from triogate.batch import CommandError
from triogate.governance import budgets, rate_limits

if TYPE_CHECKING:
    from collections.abc import Awaitable, Generator

    from triogate.batch import Batch, Handle
    from triogate.governance.facts import CheckSettings, RequestFacts, Window
    from triogate.governance.local import LocalGovernance
    from triogate.governance.principals import Identity, Principal

#: The budget's part of a merged reply: ``{admitted, spend, reserved}``.
BUDGET_PART = 3


@final
@attrs.frozen
class Part:
    """One script's part of a merged ``budget_reserve.lua`` reply, awaitable as that lone
    script's handle: the value, or its error raised."""

    handle: Handle[object]
    rates: bool  # the rate windows' part (after the budget's), else the budget's

    def __await__(self) -> Generator[object, None, object]:
        return self._get().__await__()

    async def _get(self) -> object:
        reply = await self.handle
        if not isinstance(reply, list) or not reply:
            return reply  # the reader's shape check refuses it, as a lone script's
        # A refused part is one element: its error reply.
        budget_len = 1 if isinstance(reply[0], CommandError) else BUDGET_PART
        part = reply[budget_len:] if self.rates else reply[:budget_len]
        if len(part) == 1 and isinstance(part[0], CommandError):
            raise part[0]
        return part


@final
@attrs.frozen
class Declared:
    """A request's governance calls, declared (:func:`declare`), to be concluded by
    ``budgets.conclude`` and ``rate_limits.conclude``."""

    budget_calls: list[tuple[Principal, int, int | None, Awaitable[object]]]
    rate_calls: list[tuple[Principal, tuple[Window, ...], Awaitable[object]]]


def declare(
    batch: Batch, identity: Identity, request: RequestFacts, settings: CheckSettings
) -> Declared:
    """Declare the budgets' and the rate limits' calls of ``identity`` (sync): one
    ``budget_reserve.lua`` carrying the principal's windows where it has both, the lone
    script otherwise. Conclude them in one participant (:func:`admit`) or two (the
    gateway's admission, so that one failing leaves the other's outcome to undo)."""
    rate_plans = rate_limits.plans_for(identity, request)
    windows = {(p.kind, p.id): ws for p, ws in rate_plans}
    budget_calls: list[tuple[Principal, int, int | None, Awaitable[object]]] = []
    rate_replies: dict[tuple[str, str], Part] = {}
    for p in budgets.budgeted(identity, request, settings):
        ws = windows.get((p.kind, p.id), ())
        period, end_ms, handle = budgets.declare_reserve(batch, p, request, settings,
                                                         windows=ws)
        if ws:
            rate_replies[p.kind, p.id] = Part(handle, rates=True)
            budget_calls.append((p, period, end_ms, Part(handle, rates=False)))
        else:
            budget_calls.append((p, period, end_ms, handle))
    rate_calls: list[tuple[Principal, tuple[Window, ...], Awaitable[object]]] = [
        (p, ws, rate_replies.get((p.kind, p.id))
         or rate_limits.declare_admit(batch, ws, request, settings))
        for p, ws in rate_plans
    ]
    return Declared(budget_calls=budget_calls, rate_calls=rate_calls)


async def admit(
    batch: Batch,
    identity: Identity,
    request: RequestFacts,
    settings: CheckSettings,
    local: LocalGovernance,
) -> tuple[budgets.BudgetOutcome, rate_limits.RateOutcome]:
    """Check and reserve the budgets and check and count the rate windows of ``identity``:
    ``budgets.reserve`` and ``rate_limits.admit`` in one participant, one script per
    principal. Declares every call before awaiting any (one wait, shared with the round).
    Always a checkpoint.
    """
    declared = declare(batch, identity, request, settings)
    budget = await budgets.conclude(declared.budget_calls, request, settings, local)
    rates = await rate_limits.conclude(declared.rate_calls, request, settings, local)
    return budget, rates
