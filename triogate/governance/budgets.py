"""Budgets: a participant that reserves a request's estimated cost, and its settlement.

Before the model call, :func:`reserve` declares one ``budget_reserve.lua`` call per
principal that has a budget (key, team, user, end user, tags), all in the same round,
and awaits them together: one wait. Each call checks and reserves atomically in the
principal's own hash tag. The gateway declares through ``governance.admit``, where the
call of a principal that also has rate windows admits them too (one script per
principal); :func:`conclude` reads the budget's part either way. After the call (or a
rejection, failure, cancellation or cache hit), :func:`settle` declares one
``budget_settle.lua`` per principal on the request's post-call batch: it releases the
reservation and charges the actual cost, idempotently by request id, and settles the
principal's rate windows too when given their plan (``governance.settle.settle``: one
script per principal).

The admission rule, per principal and budget period (integers, nano-USD)::

    admit  iff  spend + reserved + estimate <= max_budget
           or   spend + reserved == 0 and spend < max_budget

The second line keeps one large ``max_tokens`` estimate from locking a fresh period out
for good; the period's first request may overshoot by its own cost, never more.

Periods: ``Limits.budget_period(now_ms)`` names the period; a new period is a new key,
so nothing resets budgets. Keys live for the rest of the period plus
``budget_retention_ms``; a lifetime budget's keys never expire. A request is charged to
the period it was *admitted* in, even if it settles in the next.

When one principal rejects and others already reserved in the same round, nothing is
undone here: the handler always settles, and settling a rejected request (actual cost 0)
releases every reservation.

When Redis does not answer (:class:`~triogate.batch.BackendUnavailable`, or an error
reply): ``fail-open`` decides from the process-local ledger (``local.py``), which knows
the spend learned from earlier replies and settlements, so a principal already over
budget is still refused; ``fail-closed`` refuses with 503. Both say ``degraded=True``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, final

import attrs
import trio

from triogate.batch import BatchError, Merge, Script
from triogate.governance.decisions import Allowed, Rejected, check_failed, is_refusal
from triogate.governance.facts import principal_label
from triogate.governance.keys import MARKER_SLICE_MS, budget_keys, budget_marker
from triogate.governance.principals import KEY_MODEL, PROXY, TEAM_MODEL, Principal

if TYPE_CHECKING:
    from collections.abc import Awaitable, MutableMapping, Sequence

    from triogate.batch import Batch, Handle, PostCallBatch
    from triogate.governance.decisions import Decision
    from triogate.governance.facts import CheckSettings, RequestFacts, Window
    from triogate.governance.local import LocalGovernance
    from triogate.governance.principals import Identity
    from triogate.governance.rate_limits import RateSettlement

OWNER = "budgets"
RESERVE = Script.from_package("triogate.lua", "budget_reserve.lua")
SETTLE = Script.from_package("triogate.lua", "budget_settle.lua")
#: One principal's settlements of many requests in one flush, as one call (the settler
#: merges them: ``triogate/batch/_merge.py``; the script states why it is exact).
SETTLE_MANY = Script.from_package("triogate.lua", "budget_settle_many.lua")
#: From 4 calls: below, the merged script's own bookkeeping costs more server instructions
#: than the calls it saves (callgrind: +4.8 % per request at 2, -3 % at 4).
SETTLE_MERGE = Merge(single=SETTLE, merged=SETTLE_MANY, max_calls=128, min_calls=4)

logger = logging.getLogger("triogate.governance.budgets")


@final
@attrs.frozen(kw_only=True)
class BudgetHold:
    """One principal's part of a request's reservation.

    Attributes:
        kind, id: the principal.
        label: how messages name it (alias, or id).
        period: the budget period the request was admitted in (and is charged to).
        period_end_ms: when that period ends (epoch ms); None for a lifetime budget.
        max_budget_nanousd: the period's budget.
        amount_nanousd: the estimate reserved.
        settle_needed: a Redis reservation may exist under the request id (made there,
            or the reply was lost): settlement must run even when nothing is charged.
        spend_nanousd: spend of the period as seen at admission (Redis, or local state
            when degraded).
        reserved_nanousd: reservations of the period in flight as seen at admission
            (including this request's when it was admitted).
        degraded: decided from local state.
    """

    kind: str
    id: str
    label: str
    period: int
    period_end_ms: int | None
    max_budget_nanousd: int
    amount_nanousd: int
    settle_needed: bool
    spend_nanousd: int
    reserved_nanousd: int
    degraded: bool = False
    #: False for a principal with a soft budget only (its spend is tracked, never refused).
    hard: bool = True
    soft_budget_nanousd: int | None = None


@final
@attrs.frozen(kw_only=True)
class BudgetReservation:
    """Everything :func:`settle` needs, carried from admission to settlement."""

    request_id: str
    holds: tuple[BudgetHold, ...]
    backend: str
    marker_ttl_ms: int
    retention_ms: int


@final
@attrs.frozen(kw_only=True)
class BudgetOutcome:
    """What :func:`reserve` concluded.

    Attributes:
        decision: Allowed, or Rejected with ``check="budgets"``.
        reservation: what to settle; None when no principal has a budget (or master).
        remaining_nanousd: the smallest budget left over the principals after this
            reservation (None without budgets); never below 0.
        local: the process-local state to update on settlement.
    """

    decision: Decision
    reservation: BudgetReservation | None = None
    remaining_nanousd: int | None = None
    local: LocalGovernance | None = attrs.field(default=None, eq=False, repr=False)


@final
@attrs.frozen(kw_only=True)
class BudgetState:
    """A principal's budget in the current period, as Redis has it (for admin reads)."""

    period: int
    period_end_ms: int | None
    spend_nanousd: int
    reserved_nanousd: int
    max_budget_nanousd: int | None


def _ttl_ms(period_end_ms: int | None, now_ms: int, retention_ms: int) -> int:
    """TTL of a period's keys: the rest of the period plus retention; 0 = keep forever."""
    if period_end_ms is None:
        return 0
    return max(period_end_ms - now_ms, 0) + retention_ms


def _usd(nanousd: int) -> str:
    """Exact USD, every significant digit and no trailing zeros: ``$0.0000001``, ``$10``."""
    return f"${Decimal(nanousd).scaleb(-9).normalize():f}"


#: The cap passed for a principal with a soft budget only: never reached (2^53 - 1).
NO_CAP = 2**53 - 1
#: The proxy-wide budget's principal id.
PROXY_ID = "global"


def budgeted(
    identity: Identity, request: RequestFacts | None = None,
    settings: CheckSettings | None = None,
) -> list[Principal]:
    """The principals of ``identity`` whose spend is tracked (none for the master key):
    those with a budget or a soft budget; then, given the request, the key's and the
    team's budget for its model group (``model_max_budget``) and, given the settings,
    the proxy-wide budget. Each is one more script call of the same round."""
    if identity.master:
        return []
    out = [p for p in identity.principals()
           if p.limits.max_budget_nanousd is not None or p.soft_budget_nanousd is not None]
    if request is not None:
        group = request.model_group
        for owner, kind in ((identity.key, KEY_MODEL), (identity.team, TEAM_MODEL)):
            limits = owner.model_budgets.get(group) if owner is not None else None
            if owner is not None and limits is not None:
                out.append(Principal(kind=kind, id=f"{owner.id}:{group}", limits=limits,
                                     alias=f"{principal_label(owner)}, model {group}"))
    if settings is not None and settings.proxy_limits is not None:
        out.append(Principal(kind=PROXY, id=PROXY_ID, limits=settings.proxy_limits,
                             alias="proxy"))
    return out


def _cap(principal: Principal) -> int:
    """The budget the script checks: the hard one, else never reached."""
    cap = principal.limits.max_budget_nanousd
    return NO_CAP if cap is None else cap


def declare_reserve(
    batch: Batch,
    principal: Principal,
    request: RequestFacts,
    settings: CheckSettings,
    *,
    windows: Sequence[Window] = (),
) -> tuple[int, int | None, Handle[object]]:
    """Declare ``principal``'s ``budget_reserve.lua`` call (sync): its period, the period's
    end (None for a lifetime budget) and the handle.

    ``windows``: the same principal's rate windows, admitted in the same call
    (``governance.admit``); the reply then carries ``rate_admit.lua``'s after the budget's.
    """
    limits = principal.limits
    now_ms = request.now_ms
    period = limits.budget_period(now_ms)
    end_ms = limits.budget_period_end_ms(now_ms)
    keys: tuple[str, ...] = budget_keys(principal.kind, principal.id, period).as_tuple()
    args: list[str | int] = [
        now_ms,
        request.request_id,
        request.estimate_nanousd,
        _cap(principal),
        settings.lease_ms,
        _ttl_ms(end_ms, now_ms, settings.budget_retention_ms),
    ]
    if windows:
        keys += tuple(w.key for w in windows)
        args.append(request.estimate_tokens)
        for w in windows:
            args += (w.code, w.limit)
    handle = batch.call(RESERVE, keys=keys, args=args, backend=settings.backend, owner=OWNER)
    return period, end_ms, handle


async def reserve(
    batch: Batch,
    identity: Identity,
    request: RequestFacts,
    settings: CheckSettings,
    local: LocalGovernance,
) -> BudgetOutcome:
    """Check and reserve ``request.estimate_nanousd`` against every budget of ``identity``.

    Declares every principal's script before awaiting any, so the participant costs one
    wait, shared with the round's other participants. Always a checkpoint; with nothing to
    check (master key, no budgets) it declares nothing and joins no round.
    (The gateway uses ``governance.admit``, which also admits the rate windows.)
    """
    calls = [(p, *declare_reserve(batch, p, request, settings))
             for p in budgeted(identity, request, settings)]
    return await conclude(calls, request, settings, local)


async def conclude(
    calls: Sequence[tuple[Principal, int, int | None, Awaitable[object]]],
    request: RequestFacts,
    settings: CheckSettings,
    local: LocalGovernance,
) -> BudgetOutcome:
    """The budgets' outcome from each principal's declared call: ``(principal, period,
    period end, reply)``, as :func:`declare_reserve` gave them; awaits each reply.
    Always a checkpoint; without calls (nothing to check) the outcome is Allowed."""
    if not calls:
        await trio.lowlevel.checkpoint()
        return BudgetOutcome(decision=Allowed(), local=local)
    now_ms = request.now_ms
    holds: list[BudgetHold] = []
    rejected: Rejected | None = None
    unavailable = refused = False
    for p, period, end_ms, handle in calls:
        max_budget = _cap(p)
        reply = await _reply(handle)
        # A script refusing its arguments decides nothing: refused, never failed open.
        refused = refused or reply is REFUSED
        degraded = not isinstance(reply, tuple)
        closed = degraded and (settings.budgets_policy == "fail-closed" or reply is REFUSED)
        if isinstance(reply, tuple):
            admitted, spend, reserved = reply
            local.budgets.observe(p.kind, p.id, period, spend)
        elif not closed:
            verdict = local.budgets.reserve(
                p.kind, p.id, period,
                request_id=request.request_id,
                amount_nanousd=request.estimate_nanousd,
                max_budget_nanousd=max_budget,
                now_ms=now_ms,
                lease_ms=settings.lease_ms,
            )
            admitted = verdict.admitted
            spend, reserved = verdict.spend_nanousd, verdict.reserved_nanousd
        else:
            unavailable = True
            admitted, spend, reserved = False, local.budgets.spend(p.kind, p.id, period), 0
        hold = BudgetHold(
            kind=p.kind,
            id=p.id,
            label=principal_label(p),
            period=period,
            period_end_ms=end_ms,
            max_budget_nanousd=max_budget,
            amount_nanousd=request.estimate_nanousd,
            # A lost reply may hide a reservation made in Redis: settle it too.
            settle_needed=admitted or degraded,
            spend_nanousd=spend,
            reserved_nanousd=reserved,
            degraded=degraded,
            hard=p.limits.max_budget_nanousd is not None,
            soft_budget_nanousd=p.soft_budget_nanousd,
        )
        holds.append(hold)
        if rejected is None and not admitted and not closed:
            rejected = _over_budget(p, hold, request, degraded=degraded)

    reservation = BudgetReservation(
        request_id=request.request_id,
        holds=tuple(holds),
        backend=settings.backend,
        marker_ttl_ms=settings.settle_marker_ttl_ms,
        retention_ms=settings.budget_retention_ms,
    )
    remaining = min(
        (max(h.max_budget_nanousd - h.spend_nanousd - h.reserved_nanousd, 0)
         for h in holds if h.hard), default=None,
    )
    degraded_any = any(h.degraded for h in holds)
    decision: Decision
    if rejected is not None:
        decision = rejected
    elif refused:
        decision = check_failed("budgets")
    elif unavailable:
        decision = Rejected(
            check="budgets",
            reason="redis_unavailable",
            message="Budgets cannot be checked right now (the counter store is unavailable); "
            "try again shortly",
            status=503,
            error_type="service_unavailable",
            retry_after_s=1.0,
            degraded=True,
        )
    else:
        decision = Allowed(degraded=degraded_any)
    return BudgetOutcome(
        decision=decision, reservation=reservation, remaining_nanousd=remaining, local=local
    )


#: What :func:`_reply` returns when the script refused its arguments.
REFUSED = "refused"


async def _reply(handle: Awaitable[object]) -> tuple[bool, int, int] | str | None:
    """The script's ``{admitted, spend, reserved}``, None when Redis could not decide, or
    :data:`REFUSED` when the script refused the request's arguments."""
    try:
        reply = await handle
    except BatchError as exc:
        if is_refusal(exc):
            logger.error("budget_reserve refused its arguments: %s", exc)
            return REFUSED
        logger.warning("budget check could not reach Redis: %s", exc)
        return None
    if (
        not isinstance(reply, list)
        or len(reply) != 3
        or not all(isinstance(v, int) for v in reply)
    ):
        logger.error("budget_reserve returned an unexpected reply: %r", reply)
        return None
    return bool(reply[0]), reply[1], reply[2]


#: How messages name the budget-only principals.
_KIND_NAMES = {KEY_MODEL: "key", TEAM_MODEL: "team"}


def _over_budget(
    principal: Principal, hold: BudgetHold, request: RequestFacts, *, degraded: bool
) -> Rejected:
    kind = _KIND_NAMES.get(principal.kind, principal.kind.replace("_", " "))
    who = "The proxy-wide budget" if principal.kind == PROXY else (
        f"{kind.capitalize()} '{hold.label}'")
    parts = [f"spend {_usd(hold.spend_nanousd)} of {_usd(hold.max_budget_nanousd)} in this period"]
    if hold.spend_nanousd < hold.max_budget_nanousd:
        if hold.reserved_nanousd:
            parts.append(f"{_usd(hold.reserved_nanousd)} reserved by requests in flight")
        parts.append(f"this request may cost up to {_usd(request.estimate_nanousd)}")
    if hold.period_end_ms is None:
        parts.append("lifetime budget")
    else:
        resets = datetime.fromtimestamp(hold.period_end_ms / 1000, tz=UTC)
        parts.append(f"resets {resets.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    return Rejected(
        check="budgets",
        reason="budget_exceeded",
        message=f"Budget has been exceeded! {who}: {'; '.join(parts)}",
        status=400,
        error_type="budget_exceeded",
        degraded=degraded,
    )


def settle(
    post: PostCallBatch,
    outcome: BudgetOutcome,
    request: RequestFacts,
    *,
    actual_nanousd: int,
    now_ms: int,
    rates: MutableMapping[tuple[str, str], RateSettlement] | None = None,
) -> tuple[Handle[object], ...]:
    """Release the request's reservations and charge ``actual_nanousd`` (sync, never blocks).

    Declares one ``budget_settle.lua`` per principal that may hold a reservation or has
    something to charge, on ``post`` (the request's post-call batch); each is idempotent
    by request id, so the settler may replay it. Also updates the process-local ledger.
    Call it always: after success (the actual cost), and after a rejection, failure,
    cancellation or cache hit (0, or what the provider charged).

    ``rates`` (``rate_limits.settle_plans`` by principal): a principal's rate settlement
    found there rides in the same script call (one marker guards both) and is removed from
    the mapping; what is left the caller declares alone (``rate_limits.declare``).

    Returns:
        The declared handles (the settler resolves them; callers need not await them).

    Raises:
        ValueError: ``actual_nanousd`` is negative, or ``request`` is not the request the
            outcome belongs to.
        BatchClosed: ``post`` is closed.
    """
    reservation = outcome.reservation
    if reservation is None:
        return ()
    if actual_nanousd < 0:
        raise ValueError(f"actual_nanousd must be >= 0, not {actual_nanousd}")
    if request.request_id != reservation.request_id:
        raise ValueError("settle() got another request's outcome")
    handles = []
    for hold in reservation.holds:
        if outcome.local is not None:
            outcome.local.budgets.settle(
                hold.kind, hold.id, hold.period,
                request_id=reservation.request_id, actual_nanousd=actual_nanousd,
            )
        if not hold.settle_needed and actual_nanousd == 0:
            continue
        keys: tuple[str, ...] = (
            *budget_keys(hold.kind, hold.id, hold.period).as_tuple(),
            budget_marker(hold.kind, hold.id, now_ms),
        )
        args: tuple[str | int, ...] = (
            reservation.request_id,
            actual_nanousd,
            _ttl_ms(hold.period_end_ms, now_ms, reservation.retention_ms),
            # from the slice's first marker: every marker lives >= marker_ttl_ms
            reservation.marker_ttl_ms + MARKER_SLICE_MS,
        )
        replay_window_ms = reservation.marker_ttl_ms
        plan = rates.get((hold.kind, hold.id)) if rates is not None else None
        if rates is not None and plan is not None and plan.backend == reservation.backend and (
                plan.request_id == reservation.request_id):
            del rates[hold.kind, hold.id]
            keys += plan.window_keys
            args += (*plan.args(), *plan.codes)
            replay_window_ms = min(replay_window_ms, plan.marker_ttl_ms)
        handles.append(
            post.call(
                SETTLE,
                keys=keys,
                args=args,
                backend=reservation.backend,
                owner=OWNER,
                # A replay after the marker expired would charge (and count) twice.
                replay_window_ms=replay_window_ms,
            )
        )
    return tuple(handles)


async def budget_state(
    batch: Batch, principal: Principal, *, now_ms: int, backend: str = "counters"
) -> BudgetState:
    """Read a principal's spend and reservations for the current period (one HMGET).

    For admin reads such as ``/key/info``. A checkpoint.

    Raises:
        BackendUnavailable, CommandError: Redis could not answer.
    """
    limits = principal.limits
    period = limits.budget_period(now_ms)
    counters = budget_keys(principal.kind, principal.id, period).counters
    reply = await batch.call(
        "HMGET", keys=[counters], args=["spend", "reserved"], backend=backend, owner=OWNER
    )
    spend, reserved = (int(v) if v is not None else 0 for v in reply)
    return BudgetState(
        period=period,
        period_end_ms=limits.budget_period_end_ms(now_ms),
        spend_nanousd=spend,
        reserved_nanousd=reserved,
        max_budget_nanousd=limits.max_budget_nanousd,
    )
