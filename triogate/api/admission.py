"""Admission: every check before the model call, in one batch scope.

Participants: ``auth`` (identity: memory, else one MGET, else SQL), ``routing`` (the
group's usage, cooldowns and in-flight counts), ``cache`` (the response GET), and, once
the identity is known, ``budgets`` and ``rate_limits``. With the identity in memory all
of them declare before anyone waits, so their commands leave as ONE pipeline: one wait.
All run inline in the request's task (the scope's host); each still captures its own
error, so that one failing never loses what another reserved.
The first rejection in the fixed order (auth, budgets, rate limits, routing) wins; the
others' reservations are given back by settlement.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import attrs
import trio

from triogate.api import auth, controls, guarding, settlement
from triogate.api.errors import ApiError
from triogate.api.records import Admission
from triogate.batch import open_batch_scope
from triogate.errors import StoreError
from triogate.governance import admit as admit_governance
from triogate.governance import budgets, leases, rate_limits
from triogate.governance.decisions import Allowed, Decision, Rejected, first_rejected
from triogate.governance.facts import RequestFacts
from triogate.routing.router import RoutingFacts

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from triogate.api.records import Call
    from triogate.api.services import Services
    from triogate.batch import Batch, Participant
    from triogate.cache.response import CachedResponse, PendingLookup
    from triogate.governance.budgets import BudgetOutcome
    from triogate.governance.guardrails import Verdict
    from triogate.governance.principals import Identity
    from triogate.governance.rate_limits import RateOutcome
    from triogate.routing.router import PendingRead, RoutingState

logger = logging.getLogger("triogate.api.admission")

T = TypeVar("T")

#: The largest integer the Redis scripts accept (Lua numbers are doubles).
MAX_SCRIPT_INT = 2**53 - 1


def keep_leases(services: Services, admitted: Admission) -> AbstractContextManager[None]:
    """Renew the request's leases (reservations, parallel slots) while the block runs, so
    a call or a stream longer than ``lease_s`` keeps them (``governance/leases.py``)."""
    budget, rates = admitted.budgets, admitted.rates
    if budget is None and rates is None:
        return nullcontext()
    return services.leases.kept(admitted.request.request_id, partial(
        leases.held, budget.reservation if budget is not None else None,
        rates.admission if rates is not None else None, services.checks.lease_ms))


def estimate_nanousd(services: Services, call: Call) -> int:
    """The most the request may cost on any deployment of its group (reserved up front)."""
    return max(
        (d.price.cost_nanousd(call.input_tokens, call.output_tokens)
         for d in controls.deployments(services, call)),
        default=0,
    )


def _governed(identity: Identity | Rejected) -> Identity | None:
    """The identity budgets and rate limits apply to, or None (a rejection; the master
    key without an end user)."""
    if isinstance(identity, Rejected) or (identity.master and identity.end_user is None):
        return None
    if identity.master:  # the master key with an end user: only the end user's limits
        return attrs.evolve(identity, master=False)
    return identity


def _declare_cache(
    services: Services, batch: Batch, identity: Identity | Rejected, call: Call,
) -> tuple[str, PendingLookup | None] | None:
    """The cache GET, declared in the same round as the other checks (sync): the
    namespace and the pending lookup, or None when the caller was refused and the
    namespace needs it. The namespace depends on the caller (unless the scope is
    global), so this comes once the identity is known: in memory, that costs no round.
    """
    cache = services.cache
    assert cache is not None
    caller: Identity | None = None
    if cache.needs_identity:
        if isinstance(identity, Rejected):
            return None
        caller = identity
    namespace = cache.namespace(caller)
    if call.cache.no_cache:
        return namespace, None
    return namespace, cache.declare_lookup(batch, call.api, call.group, call.body,
                                           call.cache, namespace=namespace)


async def _finish_cache(
    services: Services, declared: tuple[str, PendingLookup | None] | Exception | None,
) -> tuple[str, CachedResponse | None, str | None] | None:
    """The cache participant's result: (namespace, hit or None, the key looked up or
    None), or None. The key goes to the store: hashing the request once is enough."""
    if isinstance(declared, Exception):
        await trio.lowlevel.checkpoint()
        raise declared
    if declared is None:
        await trio.lowlevel.checkpoint()
        return None
    assert services.cache is not None
    namespace, pending = declared
    hit = await services.cache.finish_lookup(pending)
    return namespace, hit, pending.key if pending is not None else None


async def admit(services: Services, call: Call) -> Admission:
    """Run the pre-call checks; one Redis wait when the identity is in memory.

    Raises:
        ApiError: 503 when the key store cannot be reached to identify the caller.
    """
    now_ms = services.clock_ms()
    # The handlers bound every input; this bound is the scripts' own (integers < 2^53),
    # so that no estimate can make a script refuse the request.
    tokens = min(call.input_tokens + call.output_tokens, MAX_SCRIPT_INT)
    facts = RoutingFacts(
        request_id=call.trace_id,
        now_ms=now_ms,
        estimate_tokens=tokens,
        request=call.routing,
    )
    request = RequestFacts(
        request_id=call.trace_id,
        model_group=call.group,
        estimate_nanousd=min(estimate_nanousd(services, call), MAX_SCRIPT_INT),
        estimate_tokens=tokens,
        now_ms=now_ms,
    )
    # The request's own task is the scope's host: it declares the routing read, resolves
    # the identity (in memory: no wait), declares the cache GET and the governance
    # scripts, then reads every reply in its own task: no participant needs a task (a
    # spawn, its first schedule, its exit, the nursery's wake-up). The budgets' wait is
    # the round's: everything of the round is declared by then; the replies after it are
    # already resolved (awaiting them is a cancel point, not a schedule point). With no
    # task to own, the scope opens no nursery (tasks=False).
    route: Participant[RoutingState] | None = None
    budget_p: Participant[BudgetOutcome] | None = None
    rates_p: Participant[RateOutcome] | None = None
    cached: Participant[tuple[str, CachedResponse | None, str | None] | None] | None = None
    guard_p: Participant[Rejected | None] | None = None
    verdicts: list[Verdict] = []
    async with open_batch_scope(
        services.backends, tracer=services.flush_tracer, trace_id=call.trace_id,
        rounds_before=call.request.waits_before_admission, host=True, tasks=False,
    ) as scope:
        try:
            pending_route: PendingRead | Exception = services.router.declare_read(
                scope.batch, call.group, facts)
        except Exception as exc:  # UnknownGroup: raised below, as the participant's was
            pending_route = exc
        who = await scope.run_inline(
            auth.resolve, services, scope.batch, call.request,
            call.routing.model or call.group, call.end_user, call.tags, name="auth",
        )
        resolved = _done(who)
        governed = _governed(resolved) if resolved is not None else None
        cache = services.cache
        declared_cache: tuple[str, PendingLookup | None] | Exception | None = None
        use_cache = (resolved is not None and cache is not None and cache.enabled
                     and not (call.cache.no_cache and call.cache.no_store))
        if use_cache:
            assert resolved is not None
            try:
                declared_cache = _declare_cache(services, scope.batch, resolved, call)
            except Exception as exc:  # raised below, as the participant's was
                declared_cache = exc
        if governed is not None:
            # One script per principal for its budget and rate windows (governance/admit.py),
            # declared here; the two checks read their parts as two participants (inline:
            # each captures its own error), so that one failing leaves the other's
            # outcome for _undo.
            try:
                declared: admit_governance.Declared | Exception = admit_governance.declare(
                    scope.batch, governed, request, services.checks)
            except Exception as exc:  # raised below, by both participants
                declared = exc
            budget_p = await scope.run_inline(
                _finish_budgets, services, declared, request, name="budgets")
            rates_p = await scope.run_inline(
                _finish_rates, services, declared, request, name="rate_limits")
        route = await scope.run_inline(_finish_route, services, pending_route, name="routing")
        if use_cache:
            cached = await scope.run_inline(_finish_cache, services, declared_cache,
                                            name="cache")
        # The pre-call guardrails: participants like the others, after the round (they
        # declare no Redis command, so the request still waits once), and only for a
        # caller the key store knows.
        if resolved is not None and not isinstance(resolved, Rejected):
            for spec in guarding.active(services, call, "pre_call", resolved):
                guard_p = await scope.run_inline(guarding.pre_call, services, call, spec,
                                                 verdicts, name=f"guardrail {spec.name}")
                if not _passed(guard_p):
                    break  # blocked (or failed: raised below): the next ones need not run
    waits = scope.rounds  # the alias lookup's rounds included
    services.metrics.redis_waits_child("before").observe(waits)
    try:
        identity_or_rejection = who.result()
    except StoreError as exc:
        logger.error("identity lookup failed: %s", exc)
        _undo(services, call, facts, request, now_ms, route, None, None, cached)
        raise ApiError(503, "the key store is unavailable; try again shortly",
                       "service_unavailable") from None
    except Exception:
        _undo(services, call, facts, request, now_ms, route, None, None, cached)
        raise
    identity = None if isinstance(identity_or_rejection, Rejected) else identity_or_rejection
    try:
        state = route.result()
        lookup = cached.result() if cached is not None else None
        budget = budget_p.result() if budget_p is not None else None
        rates = rates_p.result() if rates_p is not None else None
        guarded = guard_p.result() if guard_p is not None else None
    except Exception:
        # One participant failed unexpectedly (a bug): the others may hold reservations.
        _undo(services, call, facts, request, now_ms, route, budget_p, rates_p, cached,
              identity=identity)
        raise
    decisions: list[Decision | None] = [
        identity_or_rejection if isinstance(identity_or_rejection, Rejected) else None,
        budget.decision if budget else None,
        rates.decision if rates else None,
        guarded,
        services.router.decide(state),
    ]
    admission = Admission(
        identity=identity,
        rejection=first_rejected(decisions),
        routing=state,
        facts=facts,
        request=request,
        now_ms=now_ms,
        budgets=budget,
        rates=rates,
        cached=lookup[1] if lookup else None,
        cache_namespace=lookup[0] if lookup else None,
        cache_key=lookup[2] if lookup else None,
        waits_before=waits,
        guardrails=verdicts,
    )
    for check, decision in zip(("auth", "budgets", "rate_limits", "guardrails", "routing"),
                               decisions, strict=True):
        if decision is not None and decision.degraded:
            admission.degraded = True
            services.metrics.degraded_child(check).inc()
        if isinstance(decision, Allowed):
            admission.extra_headers.update(decision.headers)
    return admission


def _passed(participant: Participant[Rejected | None]) -> bool:
    """Whether a guardrail participant let the request through."""
    try:
        return participant.result() is None
    except Exception:
        return False


def _done(participant: Participant[T]) -> T | None:
    """A participant's result, or None when it failed (its error is raised elsewhere)."""
    try:
        return participant.result()
    except Exception:
        return None


async def _finish_budgets(services: Services, declared: admit_governance.Declared | Exception,
                          request: RequestFacts) -> BudgetOutcome:
    if isinstance(declared, Exception):
        await trio.lowlevel.checkpoint()
        raise declared
    return await budgets.conclude(declared.budget_calls, request, services.checks,
                                  services.local)


async def _finish_rates(services: Services, declared: admit_governance.Declared | Exception,
                        request: RequestFacts) -> RateOutcome:
    if isinstance(declared, Exception):
        await trio.lowlevel.checkpoint()
        raise declared
    return await rate_limits.conclude(declared.rate_calls, request, services.checks,
                                      services.local)


async def _finish_route(services: Services, pending: PendingRead | Exception
                        ) -> RoutingState:
    if isinstance(pending, Exception):
        await trio.lowlevel.checkpoint()
        raise pending
    return await services.router.finish_read(pending)


def _undo(
    services: Services, call: Call, facts: RoutingFacts, request: RequestFacts, now_ms: int,
    route: Participant[RoutingState],
    budget: Participant[BudgetOutcome] | None,
    rates: Participant[RateOutcome] | None,
    cached: Participant[tuple[str, CachedResponse | None, str | None] | None] | None,
    *, identity: Identity | None = None,
) -> None:
    """Admission failed part-way: settle, as a rejection, what the others reserved."""
    admission = Admission(
        identity=identity, rejection=None, routing=_done(route), facts=facts,
        request=request, now_ms=now_ms,
        budgets=_done(budget) if budget is not None else None,
        rates=_done(rates) if rates is not None else None,
        cache_namespace=((_done(cached) if cached is not None else None) or (None, None))[0],
    )
    settlement.settle(services, call, admission, outcome=settlement.rejected(500))
