"""The records of one model request: the :class:`Call` and its :class:`Admission` (a leaf).

``calls.py`` builds the Call from the HTTP request, ``admission.py`` the Admission; the
flow, the request controls and settlement read both. Here, so that none of those modules
imports another for a type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import trio

from triogate.cache.response import CacheControl
from triogate.routing.router import RequestRouting

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.errors import Style
    from triogate.api.http import Request
    from triogate.cache.response import CachedResponse
    from triogate.governance.budgets import BudgetOutcome
    from triogate.governance.decisions import Rejected
    from triogate.governance.facts import RequestFacts
    from triogate.governance.guardrails import Verdict
    from triogate.governance.principals import Identity
    from triogate.governance.rate_limits import RateOutcome
    from triogate.providers.records import Api
    from triogate.routing.router import RoutingFacts, RoutingState


@attrs.frozen(kw_only=True)
class Call:
    """One model request as the flow sees it.

    Attributes:
        api: the client's API (``chat``, ``messages``, ``responses``, ``embeddings``).
        route: label for metrics.
        style: error shape.
        body: the body to send upstream (client's shape; gateway-only fields removed).
        group: the model group asked for.
        stream: whether the client asked for a stream.
        include_usage: chat streams: whether to pass the final usage chunk on.
        request: the HTTP request.
        trace_id: unique id of this request (idempotency markers, traces, spend logs).
        end_user: the end user (``user`` field or header), if any.
        tags: request tags.
        input_tokens, output_tokens: estimates, for reservations before the call.
        cache: the request's cache controls (body ``cache`` and headers).
        routing: LiteLLM's request controls for routing (wildcard model, fallbacks,
            retries, timeout; see ``controls.py``).
        drop_params: the request's own ``drop_params``, if it sent one.
        guardrails: guardrails the request asked for by name (``guardrails``), beyond
            those on by default.
    """

    api: Api
    route: str
    style: Style
    body: dict[str, Any]
    group: str
    stream: bool
    include_usage: bool = False
    request: Request
    trace_id: str
    end_user: str | None = None
    tags: tuple[str, ...] = ()
    input_tokens: int
    output_tokens: int
    cache: CacheControl = attrs.field(factory=CacheControl)
    routing: RequestRouting = attrs.Factory(RequestRouting)
    drop_params: bool | None = None
    guardrails: tuple[str, ...] = ()
    #: The request's own ``metadata`` object (not sent upstream), for its spend row.
    metadata: Mapping[str, Any] | None = None


@attrs.define(kw_only=True)
class Admission:
    """What admission concluded, and what settlement needs to undo or settle."""

    identity: Identity | None
    rejection: Rejected | None
    routing: RoutingState | None
    facts: RoutingFacts
    request: RequestFacts
    now_ms: int
    budgets: BudgetOutcome | None = None
    rates: RateOutcome | None = None
    cached: CachedResponse | None = None
    cache_namespace: str | None = None
    #: The cache key the lookup computed, for the store to reuse (None: not looked up).
    cache_key: str | None = None
    waits_before: int = 0
    degraded: bool = False
    extra_headers: dict[str, str] = attrs.Factory(dict)
    #: Set by ``settlement.settle`` (which runs at most once per request).
    settled: bool = False
    #: The guardrails' verdicts so far (pre-, during and post-call), for the spend row.
    guardrails: list[Verdict] = attrs.Factory(list)
    #: Set when a stream's producer took over settlement.
    handed_off: bool = False
    #: When admission ended (Trio's clock): the model call starts here (traces).
    admitted_s: float = attrs.Factory(trio.current_time)
