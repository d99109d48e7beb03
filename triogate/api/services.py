"""The services a request uses, wired once by ``app.py`` and passed down to handlers.

A record, not a container with behaviour: handlers read what they need. ``app.py``
builds it; nothing in ``api/`` imports ``app``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from triogate.api.gate import AdmissionGate
from triogate.api.pacing import StreamPacer
from triogate.routing.models import ModelNames

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from triogate.batch import Backend, MemoryTracer, Settler, Tracer
    from triogate.cache.response import ResponseCache
    from triogate.config import Deployment, GatewayConfig
    from triogate.governance.alerts import Alerts
    from triogate.governance.facts import CheckSettings
    from triogate.governance.guardrails import Guardrails
    from triogate.governance.identity import IdentityResolver
    from triogate.governance.leases import LeaseKeeper
    from triogate.governance.local import LocalGovernance
    from triogate.metrics import Metrics
    from triogate.otel import SpanExporter
    from triogate.providers.records import Provider
    from triogate.routing.router import Router
    from triogate.store import Store
    from triogate.store.spendlog import SpendLogWriter


@attrs.define(kw_only=True)
class Health:
    """What readiness reports; flipped by the checks that notice."""

    redis_ok: bool = True
    #: Since when (trio clock) the gateway's own embedded server has not answered, or
    #: None; unset when Redis is external (its outages are readiness', not liveness').
    embedded_down_since: Callable[[], float | None] | None = None
    #: How long the embedded server may not answer before liveness fails.
    liveness_grace_s: float = 30.0


@attrs.frozen(kw_only=True)
class Services:
    """Everything a handler may use. Built by ``app.open_gateway``."""

    config: GatewayConfig
    backends: Mapping[str, Backend]
    settler: Settler
    tracer: MemoryTracer | None
    providers: Mapping[str, Provider]
    router: Router
    metrics: Metrics
    clock_ms: Callable[[], int]
    health: Health
    checks: CheckSettings
    local: LocalGovernance
    #: Renews the leases of the requests in flight (one task, in the app nursery).
    leases: LeaseKeeper
    identities: IdentityResolver | None = None
    store: Store | None = None
    spend_logs: SpendLogWriter | None = None
    cache: ResponseCache | None = None
    #: The configured guardrails (``guardrails:``); None without any.
    guardrails: Guardrails | None = None
    #: Budget alerts (``general_settings.alerting``); None when off.
    alerts: Alerts | None = None
    #: OpenTelemetry (``callbacks: [otel]``): request spans go here.
    spans: SpanExporter | None = None
    #: What the batch scopes report flushes to: the in-memory tracer, or the span
    #: exporter wrapping it.
    flush_tracer: Tracer | None = attrs.field(
        default=attrs.Factory(lambda self: self.spans or self.tracer, takes_self=True))
    #: Model group name → its deployments: ``config.groups`` built once, not on each of
    #: the 3-4 reads a request makes (the property builds a dict of tuples every time).
    groups: Mapping[str, tuple[Deployment, ...]] = attrs.field(
        default=attrs.Factory(lambda self: self.config.groups, takes_self=True))
    #: Model names as clients send them: groups, aliases, wildcards.
    models: ModelNames = attrs.field(
        default=attrs.Factory(lambda self: ModelNames(self.config), takes_self=True))
    #: How many requests run their pre-call checks at once (``api/gate.py``).
    gate: AdmissionGate = attrs.field(default=attrs.Factory(
        lambda self: AdmissionGate(self.config.settings.max_admitting,
                                   self.config.settings.max_admission_wait_s),
        takes_self=True))
    #: Holds streams between writes while the worker is behind (``api/pacing.py``);
    #: its probe runs in the app nursery (without it nothing is ever held).
    pacer: StreamPacer = attrs.field(default=attrs.Factory(
        lambda self: StreamPacer(self.config.settings.stream_coalesce_window_s),
        takes_self=True))
