"""Settlement: after every request, one post-call batch and one spend-log row.

Whatever happened (success, upstream failure, rejection, cancellation, cache hit), the
request's writes go to the settler in one batch: routing usage and cooldowns, and (with
governance) budget settlement and rate-limit settlement, and (with the cache) the SET.
Settlement only declares (sync, no checkpoint between its first write and the hand-off),
so a client that went away cannot cancel its own accounting half-way
(``batch.post_call_batch``: no deadline scope is needed around it).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import orjson
import trio

from triogate.batch import post_call_batch
from triogate.governance import budgets, rate_limits
from triogate.governance.settle import settle as governance_settle
from triogate.otel import RequestSpans
from triogate.providers.records import Usage
from triogate.routing.failures import describe
from triogate.store.records import SpendLogRow

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from triogate.api.records import Admission, Call
    from triogate.api.services import Services
    from triogate.batch import PostCallBatch
    from triogate.config import Deployment
    from triogate.routing.router import RouteResult

logger = logging.getLogger("triogate.requests")

R = TypeVar("R")

NO_USAGE = Usage(input_tokens=0, output_tokens=0, reported=False)


@attrs.frozen(kw_only=True)
class Outcome:
    """How a request ended, as settlement needs it.

    Attributes:
        admitted: False when a check refused it (nothing may stay counted).
        status: ``success``, ``error``, ``rejected``, ``cancelled`` or ``cache_hit``.
        http_status: what the client got (or would have).
        route: the router's result, when a deployment answered.
        usage: tokens to charge (reported by the upstream, or counted).
        body: a complete response to store in the cache.
        events: a stream's events as far as :func:`response_id` reads them (the first
            that names the response id); a stream's answer for the cache is ``body``,
            assembled as it passed (``cache/assembly.py``).
        error: the failure, for the log line.
    """

    admitted: bool
    status: str
    http_status: int
    route: RouteResult[Any] | None = None
    usage: Usage = NO_USAGE
    body: dict[str, Any] | None = None
    events: list[dict[str, Any]] | None = None
    error: BaseException | None = None

    @property
    def deployment(self) -> Deployment | None:
        return self.route.deployment if self.route is not None else None


def rejected(http_status: int) -> Outcome:
    """A check refused the request."""
    return Outcome(admitted=False, status="rejected", http_status=http_status)


def failed(error: BaseException, http_status: int, *, admitted: bool = True) -> Outcome:
    """Every attempt failed (or, with ``admitted=False``, no deployment could be tried)."""
    return Outcome(admitted=admitted, status="error", http_status=http_status, error=error)


def succeeded(route: RouteResult[Any], usage: Usage, *, body: dict[str, Any] | None = None,
              events: list[dict[str, Any]] | None = None, status: str = "success") -> Outcome:
    """A deployment answered (a stream may have ended early: ``status`` says how)."""
    return Outcome(admitted=True, status=status, http_status=200, route=route, usage=usage,
                   body=body, events=events)


def cancelled() -> Outcome:
    """The request was cancelled after admission (client gone, shutdown) before it ended.

    Counted as admitted (the upstream may have seen it), at no cost; 499 in the logs.
    """
    return Outcome(admitted=True, status="cancelled", http_status=499)


def cache_hit(usage: Usage) -> Outcome:
    """Answered from the cache (``usage`` is what the answer cost when it was made)."""
    return Outcome(admitted=True, status="cache_hit", http_status=200, usage=usage)


def cost_nanousd(outcome: Outcome) -> int:
    """What the request costs: the answering deployment's price times the usage."""
    deployment = outcome.deployment
    if deployment is None or not outcome.admitted or outcome.status == "cache_hit":
        return 0
    return deployment.price.cost_nanousd(outcome.usage.input_tokens, outcome.usage.output_tokens)


def settle(services: Services, call: Call, admitted: Admission, *, outcome: Outcome) -> None:
    """Hand the request's post-call writes to the settler; log and count the request.

    At most once per request: a second call is a no-op, so that every path of the flow
    may settle without counting twice.

    Synchronous, with no checkpoint: whoever settles needs no shield or deadline scope
    around it (a cancellation cannot land half-way), and nothing else runs between the
    request's last write and its accounting. Dropping the shielded scope each caller
    entered took 1.7 % of a governed request's instructions at one connection (with
    ``BatchScope.rounds``, measured under callgrind).

    Never raises: every step runs on its own (:func:`_guarded`), so a step that fails (an
    upstream's impossible usage, a bug) is logged and counted
    (``triogate_settlement_errors``) and the others still run: the reservations and the
    parallel slot go back, the spend-log row is written with what is known. Usage an
    upstream reported below zero is counted as zero (and logged).
    """
    if admitted.settled:
        return
    admitted.settled = True
    settle_started_s = trio.current_time() if services.spans is not None else 0.0
    settings = services.config.settings
    now_ms = services.clock_ms()
    outcome = _guarded(services, call, "usage", _sane_usage, call, outcome, fallback=outcome)
    # once: the batch, the row, the metrics and the log line
    cost = _guarded(services, call, "cost", cost_nanousd, outcome, fallback=0)
    # The callbacks below only declare (sync): no deadline or shield scope to pay for.
    with _guarded_exit(services, call), post_call_batch(
            services.settler, trace_id=call.trace_id) as post:
        # A cache hit counts for RPM but uses no tokens: its TPM reservation goes back.
        tokens = 0 if outcome.status == "cache_hit" else (
            outcome.usage.input_tokens + outcome.usage.output_tokens)
        # Budgets and rate windows: one script per principal (governance/settle.py); should
        # that fail, each on its own (idempotent by request id, so a part already declared
        # is not counted twice).
        if _guarded(services, call, "governance", _governance, post, admitted, outcome,
                    cost, tokens, now_ms, fallback=False) is False:
            _guarded(services, call, "budgets", _budgets_alone, post, admitted, cost,
                     now_ms, fallback=None)
            _guarded(services, call, "rate_limits", _rates_alone, post, admitted, outcome,
                     tokens, now_ms, fallback=None)
        if services.alerts is not None and admitted.budgets is not None and cost:
            # sync: queued, never awaited
            _guarded(services, call, "alerts", services.alerts.observe, admitted.budgets,
                     cost, fallback=None)
        if admitted.routing is not None:
            _guarded(services, call, "routing", services.router.record,
                     post, admitted.routing, outcome.route, admitted.facts,
                     usage_tokens=tokens, now_ms=now_ms, fallback=None)
        cache = services.cache
        if cache is not None and outcome.status == "success" and admitted.cached is None:
            _guarded(services, call, "cache", cache.store,
                     post, call.api, call.group, call.body,
                     outcome.body,
                     outcome.usage, call.cache, namespace=admitted.cache_namespace or "global",
                     now_ms=now_ms, key=admitted.cache_key, fallback=None)
    deployment = outcome.deployment
    duration_s = trio.current_time() - call.request.started_at
    if services.spend_logs is not None:
        row = _guarded(services, call, "spend_row", _spend_row, call, admitted, outcome,
                       now_ms, cost, prompts=services.config.store_prompts_in_spend_logs,
                       fallback=None)
        if row is None:  # what is known without the answer's body and events
            row = _guarded(services, call, "spend_row", _spend_row, call, admitted,
                           attrs.evolve(outcome, body=None, events=None), now_ms, cost,
                           prompts=False, fallback=None)
        if row is not None:
            _guarded(services, call, "spend_log", services.spend_logs.submit_nowait, row,
                     fallback=None)
    _guarded(services, call, "metrics", _observe, services, call, admitted, outcome,
             duration_s, cost, fallback=None)
    if logger.isEnabledFor(logging.INFO):  # the line's dict only when it is written
        _guarded(services, call, "log", _log_line, call, admitted, outcome, deployment,
                 duration_s, cost, log_prompts=settings.log_prompts, fallback=None)
    if services.spans is not None:
        _guarded(services, call, "spans", _request_done, services, call, admitted, outcome,
                 settle_started_s, cost, fallback=None)


def _guarded(services: Services, call: Call, step: str, run: Callable[..., R], *args: Any,
             fallback: R, **kwargs: Any) -> R:
    """``run(*args, **kwargs)``, or ``fallback`` (logged, counted) if it raises."""
    try:
        return run(*args, **kwargs)
    except Exception as exc:  # settlement goes on whatever one step does
        _step_failed(services, call, step, exc)
        return fallback


@contextmanager
def _guarded_exit(services: Services, call: Call) -> Iterator[None]:
    """The post-call batch's hand-off (its ``with`` exit) under :func:`_guarded`'s rule."""
    try:
        yield
    except Exception as exc:  # the steps after it still run
        _step_failed(services, call, "hand_off", exc)


def _step_failed(services: Services, call: Call, step: str, exc: Exception) -> None:
    # Logged without the message or a traceback: an upstream's text may carry its data.
    logger.error("a settlement step failed; settling the rest",
                 extra={"trace_id": call.trace_id, "step": step, "error": type(exc).__name__})
    with suppress(Exception):
        services.metrics.settlement_errors_child(step).inc()


def _sane_usage(call: Call, outcome: Outcome) -> Outcome:
    """``outcome`` with an upstream's negative token counts as zero (logged)."""
    usage = outcome.usage
    if usage.input_tokens >= 0 and usage.output_tokens >= 0:
        return outcome
    logger.warning("the upstream reported negative usage; counted as zero",
                   extra={"trace_id": call.trace_id, "input_tokens": usage.input_tokens,
                          "output_tokens": usage.output_tokens})
    return attrs.evolve(outcome, usage=attrs.evolve(
        usage, input_tokens=max(0, usage.input_tokens),
        output_tokens=max(0, usage.output_tokens)))


def _governance(post: PostCallBatch, admitted: Admission, outcome: Outcome, cost: int,
                tokens: int, now_ms: int) -> bool:
    governance_settle(post, admitted.request, budget_outcome=admitted.budgets,
                      rate_outcome=admitted.rates, actual_nanousd=cost,
                      actual_tokens=tokens, admitted=outcome.admitted, now_ms=now_ms)
    return True


def _budgets_alone(post: PostCallBatch, admitted: Admission, cost: int, now_ms: int) -> None:
    if admitted.budgets is not None:
        budgets.settle(post, admitted.budgets, admitted.request,
                       actual_nanousd=max(0, cost), now_ms=now_ms)


def _rates_alone(post: PostCallBatch, admitted: Admission, outcome: Outcome, tokens: int,
                 now_ms: int) -> None:
    if admitted.rates is not None:
        rate_limits.settle(post, admitted.rates, admitted.request,
                           actual_tokens=max(0, tokens), admitted=outcome.admitted,
                           now_ms=now_ms)


def _observe(services: Services, call: Call, admitted: Admission, outcome: Outcome,
             duration_s: float, cost: int) -> None:
    deployment = outcome.deployment
    services.metrics.observe_request(
        call.route, call.group, deployment.id if deployment else "-",
        outcome.http_status or 0, duration_s, cost_nanousd=cost,
    )
    if admitted.routing is not None:
        services.metrics.observe_attempts(admitted.routing.attempts)


def _request_done(services: Services, call: Call, admitted: Admission, outcome: Outcome,
                  settle_started_s: float, cost: int) -> None:
    assert services.spans is not None
    services.spans.request_done(_spans(call, admitted, outcome, settle_started_s, cost))


def _log_line(call: Call, admitted: Admission, outcome: Outcome, deployment: Deployment | None,
              duration_s: float, cost: int, *, log_prompts: bool) -> None:
    line: dict[str, object] = {
        "trace_id": call.trace_id,
        "route": call.route,
        "model_group": call.group,
        "deployment": deployment.id if deployment else None,
        "status": outcome.status,
        "latency_ms": round(duration_s * 1000, 1),
        "input_tokens": outcome.usage.input_tokens,
        "output_tokens": outcome.usage.output_tokens,
        "cost_nanousd": cost,
        "stream": call.stream,
    }
    if outcome.error is not None:  # why, and which deployments were tried
        line["error"] = describe(outcome.error)
        if admitted.routing is not None:
            line["attempted"] = [a.deployment_id for a in admitted.routing.attempts]
    if log_prompts:  # off by default: prompts and answers are the users' data
        line["request_body"] = call.body
        line["response_body"] = outcome.body
    logger.info("request", extra=line)


def _spans(call: Call, admitted: Admission, outcome: Outcome, settle_started_s: float,
           cost: int) -> RequestSpans:
    attempts = (outcome.route.attempts if outcome.route is not None
                else tuple(admitted.routing.attempts) if admitted.routing is not None else ())
    return RequestSpans(
        trace_id=call.trace_id, route=call.route, group=call.group, status=outcome.status,
        http_status=outcome.http_status, started_s=call.request.started_at,
        admitted_s=admitted.admitted_s, settle_started_s=settle_started_s,
        ended_s=trio.current_time(), attempts=attempts,
        deployment=outcome.deployment.id if outcome.deployment else None,
        input_tokens=outcome.usage.input_tokens, output_tokens=outcome.usage.output_tokens,
        cost_nanousd=cost,
    )


def _spend_metadata(call: Call, admitted: Admission) -> str:
    """LiteLLM's spend-log ``metadata``: who was charged, and the request's own
    ``metadata`` (its ``spend_logs_metadata`` also on its own, as LiteLLM shows it)."""
    identity = admitted.identity
    key = identity.key if identity is not None and not identity.master else None
    out: dict[str, Any] = {
        "user_api_key": key.id if key else None,
        "user_api_key_alias": key.alias if key else None,
        "user_api_key_team_id": identity.team.id if identity and identity.team else None,
        "user_api_key_user_id": identity.user.id if identity and identity.user else None,
        "user_api_key_end_user_id": call.end_user,
    }
    if call.metadata:
        out["requester_metadata"] = call.metadata
        if isinstance(call.metadata.get("spend_logs_metadata"), dict):
            out["spend_logs_metadata"] = call.metadata["spend_logs_metadata"]
    return orjson.dumps(out).decode()


def _prompts(call: Call, outcome: Outcome) -> tuple[str | None, str | None]:
    """The request's messages (or input) and the answer, as JSON text."""
    body = call.body
    sent = next((body[f] for f in ("messages", "input", "prompt") if f in body), None)
    answer = outcome.body  # a stream's: assembled as it passed (flow._stream)
    return (None if sent is None else orjson.dumps(sent).decode(),
            None if answer is None else orjson.dumps(answer).decode())


def _spend_row(call: Call, admitted: Admission, outcome: Outcome, now_ms: int, cost: int,
               *, prompts: bool = False) -> SpendLogRow:
    identity = admitted.identity
    key = identity.key if identity is not None and not identity.master else None
    deployment = outcome.deployment
    messages, response = _prompts(call, outcome) if prompts else (None, None)
    return SpendLogRow(
        request_id=call.trace_id,
        api=call.api,
        key_hash=key.id if key else None,
        key_alias=key.alias if key else None,
        team_id=identity.team.id if identity and identity.team else None,
        user_id=identity.user.id if identity and identity.user else None,
        end_user=call.end_user,
        tags=tuple(dict.fromkeys((*call.tags, *(t.id for t in identity.tags)) if identity
                                 else call.tags)),
        # The group that answered: a fallback's, when the requested group's failed.
        model_group=outcome.route.group_used if outcome.route is not None else call.group,
        deployment_id=deployment.id if deployment else None,
        upstream_model=deployment.upstream_model if deployment else None,
        input_tokens=outcome.usage.input_tokens,
        output_tokens=outcome.usage.output_tokens,
        cost_nanousd=cost,
        cache_hit=outcome.status == "cache_hit",
        status="success" if outcome.status == "cache_hit" else outcome.status,
        http_status=outcome.http_status or None,
        latency_ms=max(0, now_ms - admitted.now_ms),
        start_time_ms=admitted.now_ms,
        end_time_ms=now_ms,
        response_id=response_id(outcome),
        client_request_id=(call.request.request_id
                           if call.request.request_id != call.trace_id else None),
        guardrails=orjson.dumps([v.record() for v in admitted.guardrails]).decode()
        if admitted.guardrails else None,
        metadata=_spend_metadata(call, admitted),
        cache_key=admitted.cache_key,
        api_base=deployment.api_base if deployment else None,
        messages=messages,
        response=response,
    )


def response_id(outcome: Outcome) -> str | None:
    """The response's own id (``chatcmpl-…``, ``msg_…``, ``resp_…``), from the body or the
    stream's first event that names one."""
    found: Any = None
    if outcome.body is not None:
        found = outcome.body.get("id")
    for event in outcome.events or ():
        if found is not None:
            break
        found = named_id(event)
    return found[:256] if isinstance(found, str) and found else None


def named_id(event: Mapping[str, Any]) -> Any:
    """The id a stream event names (its own, or its message's or response's), or None:
    :func:`response_id` reads the events up to the first that names one."""
    found = event.get("id")
    for inner in ("message", "response"):  # Anthropic message_start, Responses events
        if found is None and isinstance(event.get(inner), dict):
            found = event[inner].get("id")
    return found
