"""One model request, whatever its API: admit, call, settle.

1. **Admit** (``admission.py``): one batch scope; auth, budgets, rate limits, routing
   and the cache GET are participants, so with the identity in memory they share one
   Redis round trip.
2. **Call** the chosen deployment through the router's retries and fallbacks, or answer
   from the cache.
3. **Settle**: whatever happened (success, upstream failure, rejection, cancellation,
   cache hit), one post-call batch carries settlement, usage and the cache SET to the
   settler, and one spend-log row goes to the SQL writer.

A stream is opened (with retries) before the status line goes out, so a failure before
the first token is a proper error response; after it, an error event ends the stream
and what was produced is still charged. While the worker is behind, a stream waits a short
window between a client write and its next upstream read (``api/pacing.py``), so that one
write carries the window's events; a worker that keeps up forwards each event at once.

**Settlement happens exactly once, on every path.** Whatever ends a request after
admission (a provider error, a translation error, a bug, a cancellation), :func:`serve`
settles it before the exception travels on: reservations and the parallel slot are given
back, the actual cost (if any) charged, one spend-log row written with its status.
``Admission.settled`` makes a second settlement a no-op. A stream's settlement belongs to
its producer, which always runs once the response is handed over.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import attrs
import orjson
import trio

from triogate.api import admission, calls, controls, guarding, settlement, sse
from triogate.api.auth import group_providers
from triogate.api.errors import ApiError, from_provider, from_rejection
from triogate.api.gate import overloaded
from triogate.api.http import ClientGone, Response, StreamResponse
from triogate.cache.replay import assembler, replay
from triogate.errors import ProviderError, TranslationError
from triogate.routing.router import NoDeploymentAvailable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from triogate.api.http import Receive, Send
    from triogate.api.records import Admission, Call
    from triogate.api.services import Services
    from triogate.cache.assembly import Assembler
    from triogate.config import Deployment
    from triogate.governance.decisions import Rejected
    from triogate.providers.records import Completion, ProviderStream
    from triogate.routing.router import RouteResult

logger = logging.getLogger("triogate.api.flow")

#: Bound on closing an upstream stream under a shield (a stuck upstream must not pin the
#: request task for ever).
CLOSE_TIMEOUT_S = 5.0

T = TypeVar("T")


async def serve(services: Services, call: Call) -> Response:
    """Run ``call`` through admission, the model and settlement; return the response.

    Settles exactly once whatever happens after admission (see the module docstring).
    """
    call.request.authenticated = True  # admission checks the key first of all
    gate = services.gate
    if not await gate.enter():
        raise overloaded(call.style, "the gateway is busy with other requests' checks; "
                         "retry shortly")
    try:
        admitted = await admission.admit(services, call)
    finally:
        gate.leave()
    try:
        if admitted.rejection is not None:
            error = from_rejection(admitted.rejection)
            settlement.settle(services, call, admitted,
                              outcome=settlement.rejected(error.status))
            error.headers = {**response_headers(services, call, admitted), **error.headers}
            raise error
        if admitted.cached is not None:
            return await _from_cache(services, call, admitted)
        if call.stream and guarding.wanted(services, call, "post_call", admitted.identity):
            return await _stream_checked(services, call, admitted)
        if call.stream:
            return await _stream(services, call, admitted)
        return await _complete(services, call, admitted)
    except Exception as exc:
        if not admitted.settled:  # a bug past admission: give everything back, then 500
            logger.error("request failed after admission; settling it",
                         extra={"trace_id": call.trace_id, "error": type(exc).__name__})
            settlement.settle(services, call, admitted,
                              outcome=settlement.failed(exc, 500, admitted=False))
        raise
    finally:
        # Cancelled (client gone, shutdown) with nothing settled yet.
        if not admitted.settled and not admitted.handed_off:
            settlement.settle(services, call, admitted, outcome=settlement.cancelled())


def response_headers(services: Services, call: Call, admitted: Admission, *,
                     deployment: Deployment | None = None,
                     cost_nanousd: int | None = None) -> dict[str, str]:
    """Response headers: degradation, limits, cache status, tracing, LiteLLM's."""
    headers = dict(admitted.extra_headers)
    headers.update(controls.litellm_headers(call, admitted, deployment=deployment,
                                            cost_nanousd=cost_nanousd))
    if admitted.degraded:
        headers["x-triogate-degraded"] = "redis"
    if deployment is not None:
        headers["x-triogate-deployment"] = deployment.id
    if services.cache is not None:
        headers.update(services.cache.header(admitted.cached is not None))
    if services.tracer is not None:
        headers["x-triogate-trace-id"] = call.trace_id
        headers["x-triogate-redis-waits-before"] = str(admitted.waits_before)
    return headers


async def _from_cache(services: Services, call: Call, admitted: Admission) -> Response:
    """Answer from the cache: counts for RPM, costs nothing, gives its reservations back."""
    cached = admitted.cached
    assert cached is not None
    outcome = settlement.cache_hit(cached.usage)
    if not call.stream:  # written first, then settled (SettledAfter)
        return SettledAfter(orjson.dumps(cached.body), response_headers(
            services, call, admitted), services, call, admitted, outcome)
    settlement.settle(services, call, admitted, outcome=outcome)
    headers = response_headers(services, call, admitted)
    events = replay(call.api, cached.body)

    async def produce(write: Callable[[bytes], Awaitable[None]]) -> None:
        for event in events:
            if _forward(call, event):
                await write(sse.encode(call.api, event))
        await write(sse.end(call.api))

    return StreamResponse(produce, headers=headers)


async def _route(
    services: Services, call: Call, admitted: Admission,
    attempt: Callable[[Deployment], Awaitable[T]],
) -> RouteResult[T]:
    """Run ``attempt`` through the router's retries and fallbacks; on failure, settle
    the request and raise the error to send."""
    assert admitted.routing is not None
    identity = admitted.identity

    def allowed(group: str) -> bool:  # fallbacks, context-window fallbacks
        return identity is None or identity.first_refusing(
            group, providers=partial(group_providers, services, group)) is None

    try:
        return await services.router.run(admitted.routing, attempt, admitted.facts,
                                         allowed=allowed)
    except (ProviderError, NoDeploymentAvailable, TranslationError) as exc:
        raise _failed(services, call, admitted, exc) from None


async def _complete(services: Services, call: Call, admitted: Admission) -> Response:
    result, outcome = await _checked_answer(services, call, admitted)
    headers = response_headers(services, call, admitted, deployment=result.deployment,
                               cost_nanousd=settlement.cost_nanousd(outcome))
    return SettledAfter(orjson.dumps(result.value.body), headers, services, call, admitted,
                        outcome)


async def _checked_answer(
    services: Services, call: Call, admitted: Admission,
) -> tuple[RouteResult[Completion], settlement.Outcome]:
    """The model's whole answer, read (and perhaps masked) by the ``post_call``
    guardrails; a block is settled as paid and raised. The upstream is asked without
    streaming, whatever the client asked for."""
    async def attempt(deployment: Deployment) -> Completion:
        provider = services.providers[deployment.provider]
        body = controls.body_for(call, deployment)
        if call.stream:
            body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        return await provider.complete(call.api, body, deployment)

    with admission.keep_leases(services, admitted):
        routed = _guarded_route(services, call, admitted, attempt)
        try:
            result = await (_unless_gone(services, call, admitted, routed)
                            if services.config.settings.http.cancel_when_client_leaves
                            and call.request.watch_disconnect else routed)
        except guarding.GuardrailBlocked as blocked:  # a streaming request's, answered whole
            _refuse_answered(services, call, admitted, settlement.succeeded(
                blocked.result, blocked.result.value.usage), blocked.rejected)
    completion = result.value
    outcome = settlement.succeeded(result, completion.usage, body=completion.body)
    if guarding.wanted(services, call, "post_call", admitted.identity):
        rejected = await guarding.post_call(services, call, admitted, completion.body)
        if rejected is not None:
            _refuse_answered(services, call, admitted, outcome, rejected)
    return result, outcome


async def _stream_checked(services: Services, call: Call, admitted: Admission) -> Response:
    """A stream whose answer ``post_call`` guardrails read: nothing leaves before they
    passed. The whole answer is asked for, checked (masked, or refused with a 400 before
    any event), settled, then sent as the events of the client's API (as a cached answer
    is): the first token waits for the last, the price of a check that sees it all."""
    result, outcome = await _checked_answer(services, call, admitted)
    try:
        events = replay(call.api, result.value.body)
    except ValueError as exc:  # not an answer of the client's API: the upstream's fault
        error = ApiError(502, "the upstream model sent a reply that could not be read",
                         "api_error")
        settlement.settle(services, call, admitted, outcome=attrs.evolve(
            outcome, status="error", http_status=error.status, body=None, error=exc))
        raise error from None
    settlement.settle(services, call, admitted, outcome=outcome)
    headers = response_headers(services, call, admitted, deployment=result.deployment,
                               cost_nanousd=settlement.cost_nanousd(outcome))

    async def produce(write: Callable[[bytes], Awaitable[None]]) -> None:
        await write(b"".join(sse.encode(call.api, event) for event in events
                             if _forward(call, event)) + sse.end(call.api))

    return StreamResponse(produce, headers=headers)


async def _guarded_route(
    services: Services, call: Call, admitted: Admission,
    attempt: Callable[[Deployment], Awaitable[T]],
) -> RouteResult[T]:
    """:func:`_route`, with the ``during_call`` guardrails running next to it (a complete
    answer they block is settled as paid and refused here; a stream's is the caller's)."""
    if not guarding.wanted(services, call, "during_call", admitted.identity):
        return await _route(services, call, admitted, attempt)
    run: Callable[[], Awaitable[RouteResult[T]]] = lambda: _route(  # noqa: E731
        services, call, admitted, attempt)
    if call.stream:
        return await guarding.during_call(services, call, admitted, run)  # type: ignore[no-any-return]
    try:
        return await guarding.during_call(services, call, admitted, run)  # type: ignore[no-any-return]
    except guarding.GuardrailBlocked as blocked:
        completion = blocked.result.value
        _refuse_answered(services, call, admitted, settlement.succeeded(
            blocked.result, completion.usage), blocked.rejected)


def _refuse_answered(services: Services, call: Call, admitted: Admission,
                     outcome: settlement.Outcome, rejected: Rejected) -> NoReturn:
    """A guardrail refused an answer the model already gave: charged, never cached,
    answered 400 with the guardrail's message."""
    error = from_rejection(rejected)
    settlement.settle(services, call, admitted, outcome=attrs.evolve(
        outcome, status="error", http_status=error.status, body=None))
    error.headers = {**response_headers(services, call, admitted), **error.headers}
    raise error


async def _unless_gone(services: Services, call: Call, admitted: Admission,
                       work: Awaitable[T]) -> T:
    """``work``'s result, unless the client leaves first (``http.disconnect`` once its
    body is in): then ``work`` (the upstream call) is cancelled, its connection dropped,
    the request settled as cancelled (reservations and the parallel slot given back at
    once, not after the upstream's answer) and :class:`ClientGone` raised."""
    done: list[T] = []
    error: Exception | None = None
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            while (await call.request.receive())["type"] != "http.disconnect":
                pass
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        try:
            done.append(await work)
        except Exception as exc:  # raised as it is, not in the nursery's group
            error = exc
        finally:
            nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    if not done:
        if not admitted.settled:
            settlement.settle(services, call, admitted, outcome=settlement.cancelled())
        raise ClientGone()
    return done[0]


class SettledAfter(Response):
    """A complete response whose request settles once its bytes are written.

    Settling (the post-call batch's declarations, the cache entry, the spend-log row,
    metrics, the log line: ~0.2 ms) used to run between the upstream's answer and the
    client's, on every request's critical path. The client has its answer first now; the
    settlement follows in the same task with no schedule point in between, so nothing else
    runs before the request's writes are queued (what a test or the client's next request
    sees is unchanged), and at one connection it runs while the client turns around.
    Whatever happens to the write (the client gone, a cancellation), it settles: settling
    is synchronous, so no cancellation can land half-way and no shield is needed.

    Settling later instead, when the worker idles, was tried and measured (under
    callgrind): at one connection the next request then waits for a
    wake-up instead (the worker is asleep when it arrives), two more run-loop passes per
    request, and no latency gained.
    """

    def __init__(self, body: bytes, headers: dict[str, str], services: Services, call: Call,
                 admitted: Admission, outcome: settlement.Outcome) -> None:
        super().__init__(body, headers=headers)
        self._settle = (services, call, admitted, outcome)
        admitted.handed_off = True  # ``send`` settles; if it never runs, the ASGI layer does
        call.request.unsettled.append(self.settle)

    async def send(self, send: Send, receive: Receive, *, head: bool = False) -> None:
        try:
            await super().send(send, receive, head=head)
        finally:  # sync: nothing can cancel it half-way
            self.settle()

    def settle(self) -> None:
        """Settle the request now (once: later calls do nothing). For a response that
        is part of another one (``multi.py``) and never sent itself."""
        services, call, admitted, outcome = self._settle
        settlement.settle(services, call, admitted, outcome=outcome)

    def refuse(self, exc: Exception, error: ApiError) -> ApiError:
        """Settle now, as a failure the client gets as ``error`` instead of this answer
        (it could not be turned into the client's API): the upstream's usage is charged.
        Returns ``error``, to raise."""
        services, call, admitted, outcome = self._settle
        settlement.settle(services, call, admitted, outcome=attrs.evolve(
            outcome, status="error", http_status=error.status, body=None, error=exc))
        return error


@attrs.define
class _Open:
    """A stream whose first event already arrived (so retries could still happen)."""

    stack: AsyncExitStack
    stream: ProviderStream
    events: AsyncIterator[dict[str, Any]]
    first: dict[str, Any] | None
    first_wire: bytes | None


async def _stream(services: Services, call: Call, admitted: Admission) -> Response:
    async def attempt(deployment: Deployment) -> _Open:
        provider = services.providers[deployment.provider]
        stack = AsyncExitStack()
        try:
            stream = await stack.enter_async_context(provider.stream(
                call.api, controls.body_for(call, deployment), deployment))
            events = stream.__aiter__()
            first = await anext(events, None)
        except BaseException:
            with trio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await stack.aclose()
            raise
        return _Open(stack, stream, events, first, stream.wire)

    with admission.keep_leases(services, admitted):
        try:
            result = await _guarded_route(services, call, admitted, attempt)
        except guarding.GuardrailBlocked as blocked:
            with trio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await blocked.result.value.stack.aclose()
            _refuse_answered(services, call, admitted, settlement.succeeded(
                blocked.result, blocked.result.value.stream.usage), blocked.rejected)
    opened = result.value
    first_token_s = trio.current_time() - call.request.started_at
    services.metrics.ttft_child(call.route, call.group).observe(first_token_s)

    async def produce(write: Callable[[bytes], Awaitable[None]]) -> None:
        # The outcome needs the first event that names the response id (all that
        # settlement.response_id reads) and, when the response cache stores the answer or
        # the request's log line or spend row carries it (log_prompts,
        # store_prompts_in_spend_logs), the answer: each event is
        # folded into it as it passes (cache/assembly.py keeps the text pieces, not the
        # events). Keeping every event (as dicts, then as wire bytes parsed again at the
        # end) cost the collector's walks, ~90 MB at 4,096 streams and ~1 us per chunk
        # (bench/streams.py).
        naming: list[dict[str, Any]] | None = None  # [that event], once one came
        cache = services.cache
        wanted = (services.config.settings.log_prompts
                  or services.config.store_prompts_in_spend_logs
                  or (cache is not None and admitted.cached is None
                      and cache.stores(call.cache)))
        assembly = assembler(call.api) if wanted else None
        fold = assembly.feed if assembly is not None else None
        error: ProviderError | None = None
        finished = False
        # Per event: no _forward call, no anext() wrapper (a coroutine layer per wait).
        usage_filtered = call.api == "chat" and not call.include_usage
        # The output this request allows: past it (a quarter more, for the count's
        # error until the upstream reports) the stream is a runaway and is ended.
        bound = calls.stream_output_bound(services, call.api, call.body)
        cutoff = bound + bound // 4 + 16
        cut = False
        unchecked = 1  # writes until the output is counted again
        receive = opened.events.__anext__
        pacer = services.pacer
        pacer.opened()
        try:
            with admission.keep_leases(services, admitted):  # a stream past lease_s
                stream = opened.stream
                next_nowait = stream.next_nowait
                event, wire = opened.first, opened.first_wire
                while event is not None:
                    # Events the upstream's last read brought together leave in one write
                    # (a write costs more than the event's own work). An event the
                    # upstream wrote as the client's API would goes on as it came (wire).
                    burst: list[bytes] = []
                    while event is not None:
                        if fold is not None:
                            fold(event)
                        if naming is None and settlement.named_id(event) is not None:
                            naming = [event]
                        if not usage_filtered or not _usage_only(event):
                            burst.append(wire if wire is not None
                                         else sse.encode(call.api, event))
                        event = next_nowait()
                        wire = stream.wire
                    if burst:
                        data = b"".join(burst)
                        await write(data)
                        # The count is read every 8th write (a usage record each time
                        # costs ~1 us), and after any large one.
                        unchecked -= 1
                        if unchecked <= 0 or len(data) > 8192:
                            unchecked = 8
                            if stream.usage.output_tokens > cutoff:
                                cut = True
                                break
                        if pacer.behind:  # the next read carries a window's events
                            await pacer.hold()
                    try:
                        event = await receive()
                    except StopAsyncIteration:
                        event = None
                    wire = stream.wire
            if cut:
                await write(sse.error(call.api, ApiError(
                    502, f"the upstream model sent more than the {bound} output tokens "
                    "this request allows; the stream was stopped", "api_error",
                    code="upstream_output_bound")))
            else:
                await write(sse.end(call.api))
                finished = True
        except ProviderError as exc:
            error = exc
            await write(sse.error(call.api, from_provider(exc)))
        finally:
            pacer.closed()
            with trio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await opened.stack.aclose()
            usage = opened.stream.usage
            if cut:  # billed as far as the request allowed, no further
                usage = attrs.evolve(usage, output_tokens=min(usage.output_tokens, bound))
            body, events = (_outcome_events(assembly, naming or []) if finished
                            else (None, None))
            outcome = settlement.succeeded(
                result, usage, body=body, events=events,
                status="success" if finished else (
                    "error" if error or cut else "cancelled"),
            )
            settlement.settle(services, call, admitted, outcome=outcome)

    headers = response_headers(services, call, admitted, deployment=result.deployment)
    response = StreamResponse(produce, headers=headers)
    admitted.handed_off = True  # ``produce`` settles, and StreamResponse always runs it
    return response


def _outcome_events(assembly: Assembler | None, naming: list[dict[str, Any]]
                    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A finished stream's outcome: the answer its assembly made, when the response cache
    stores it or the log line carries it (None without one, or when the stream was no
    answer: nothing is stored or logged),
    and its events as far as :func:`settlement.response_id` reads them: ``naming``, the
    first event that names the response id (the events before it name none), or none."""
    return (assembly.result() if assembly is not None else None), naming


def _forward(call: Call, event: dict[str, Any]) -> bool:
    """Chat streams: the final usage chunk goes out only if the client asked for it."""
    if call.api != "chat" or call.include_usage:
        return True
    return not _usage_only(event)


def _usage_only(event: dict[str, Any]) -> bool:
    """A chat chunk that carries usage and no choices (the final usage chunk)."""
    return bool(event.get("usage") and not event.get("choices"))


def _failed(services: Services, call: Call, admitted: Admission,
            exc: ProviderError | NoDeploymentAvailable | TranslationError) -> ApiError:
    """Settle a request that got no answer; the error to send.

    A request the upstream never saw (no deployment, or one it cannot be translated
    for) gives its quota back; an upstream failure was a real attempt and is counted.
    """
    error = _api_error(exc)
    upstream_saw_it = isinstance(exc, ProviderError)
    settlement.settle(services, call, admitted, outcome=settlement.failed(
        exc, error.status, admitted=upstream_saw_it))
    return error


def _api_error(exc: ProviderError | NoDeploymentAvailable | TranslationError) -> ApiError:
    if isinstance(exc, TranslationError):
        # Raised by translation for what this upstream cannot express.
        return ApiError(400, str(exc), "invalid_request_error", code="unsupported_for_model")
    if isinstance(exc, NoDeploymentAvailable):
        status = 429 if exc.reason == "limits" else 503
        return ApiError(
            status,
            f"no deployment of '{exc.group}' is available right now ({exc.reason})",
            "rate_limit_error" if status == 429 else "service_unavailable",
            code="no_deployment_available",
            headers={"retry-after": str(max(1, round(exc.retry_after_s)))},
        )
    return from_provider(exc)

