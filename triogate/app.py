"""The composition root: the only place where the gateway's parts are wired together.

``open_gateway(config)`` is the app nursery: it owns the Redis client (and the embedded
server when no ``redis_url`` is set), the settler, the SQL store and its spend-log
writer, the provider HTTP clients and the identity resolver. ``serve`` runs the HTTP
server (:mod:`triogate.server`) inside it. Shutdown order: stop accepting, let in-flight
requests finish (bounded by ``shutdown_grace_s``), then drain the settler and the
spend-log writer, then close clients and stop the embedded server.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import time
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from importlib import resources
from typing import TYPE_CHECKING, Any

import httpx
import trio

from triogate.api import protocol_errors
from triogate.api.asgi import GatewayASGI
from triogate.api.gate import AdmissionGate
from triogate.api.pacing import StreamPacer
from triogate.api.services import Health, Services
from triogate.batch import (
    BackendUnavailable,
    ClusterBackend,
    DeadLetterFile,
    Journal,
    MemoryTracer,
    RedisAddress,
    RespBackend,
    Script,
    SentinelAddress,
    SentinelBackend,
    Settler,
    cluster_seeds,
    redact_url,
)
from triogate.cache.response import ResponseCache
from triogate.errors import ConfigError
from triogate.governance import budgets
from triogate.governance.alerts import Alerts
from triogate.governance.facts import CheckSettings
from triogate.governance.guardrails import Guardrails
from triogate.governance.identity import IdentityResolver
from triogate.governance.leases import LeaseKeeper
from triogate.governance.local import LocalGovernance
from triogate.governance.principals import Limits
from triogate.governance.rotation import KeyRotator
from triogate.metrics import Metrics
from triogate.otel import SpanExporter
from triogate.providers import build_providers
from triogate.redis_server import open_embedded_server
from triogate.routing.router import Router
from triogate.server import (
    ServerConfig,
    connections_for,
    open_files_limit,
    raise_open_files_limit,
)
from triogate.server import serve as serve_http
from triogate.store import open_store
from triogate.store.spendlog import SpendLogWriter

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from triogate.batch import PostCallBatch
    from triogate.config import GatewayConfig

logger = logging.getLogger("triogate")

#: The backend names the gateway's checks declare on; all alias one Redis by default.
BACKEND_NAMES = ("counters", "cache", "identity")


def _read_lua_scripts() -> tuple[Script, ...]:
    names = sorted(p.name for p in resources.files("triogate.lua").iterdir()
                   if p.name.endswith(".lua"))
    return tuple(Script.from_package("triogate.lua", n) for n in names)


#: Every script in ``triogate/lua``, read once when this module is imported: start-up and
#: the embedded server's restart hook then load them without reading files on the loop.
LUA_SCRIPTS = _read_lua_scripts()


def lua_scripts() -> list[Script]:
    """Every script in ``triogate/lua``: the registry a journal replay resolves names in."""
    return list(LUA_SCRIPTS)


def check_redis_url(url: str | None) -> None:
    """Parse ``triogate.redis.url`` as the backend will (any mode), before anything starts.

    Raises:
        ConfigError: the URL cannot be used, with the reason (the password redacted).
    """
    if url is None:
        return
    try:
        if ClusterBackend.is_cluster_url(url):
            cluster_seeds(url)
        elif SentinelBackend.is_sentinel_url(url):
            SentinelAddress.from_url(url)
        else:
            RedisAddress.from_url(url)
    except ValueError as exc:
        raise ConfigError(f"triogate.redis.url {redact_url(url)}: {exc}") from None


async def load_scripts(backend: RespBackend | ClusterBackend | SentinelBackend) -> int:
    """``SCRIPT LOAD`` every script in ``triogate/lua`` (one pipeline; on a cluster, every
    primary), so that even the first request after start-up costs one wait; a NOSCRIPT
    later (Redis restarted) still falls back to EVAL for its owner. Returns how many were
    loaded (0 if Redis is down).
    """
    scripts = lua_scripts()
    try:
        await backend.execute([("SCRIPT", "LOAD", s.source) for s in scripts])
    except BackendUnavailable as exc:
        logger.warning("could not preload scripts: %s", exc.reason)
        return 0
    return len(scripts)


#: Collector thresholds while serving. Python's default (700, 10, 10) runs a young
#: collection every 700 surviving container allocations, several per request, and a full
#: one often enough to walk every object of the imports: the stalls behind the tail.
GC_THRESHOLDS = (20_000, 20, 20)
#: Pending connections the kernel queues for accept (capped by net.core.somaxconn).
#: A backlog of 100 (hypercorn's default) drops the SYNs of a burst of new connections, which then
#: wait for the client's retransmission (1 s, 3 s, 7 s...) before the gateway sees them:
#: at 4,096 connections most of them, so the in-flight limit could not even refuse them.
LISTEN_BACKLOG = 4096


#: The example config's master key: fine on loopback, refused anywhere else.
EXAMPLE_MASTER_KEY = "sk-triogate-dev"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def insecure_key(config: GatewayConfig) -> str | None:
    """Why the master key is not fit for a public address (None when it is)."""
    if config.master_key is None:
        return "no master key"
    if config.master_key == EXAMPLE_MASTER_KEY:
        return "the example master key"
    return None


def check_bind(config: GatewayConfig, host: str) -> None:
    """Refuse to listen on a public address without a real master key: the one safety
    check of both ways to serve (``triogate serve``, and the ASGI application under any
    server, where it runs for each new server address a request arrives on).

    Raises:
        ConfigError: ``host`` is not loopback and the master key is missing or the example's.
    """
    why = insecure_key(config)
    if why is not None and host not in LOOPBACK:
        raise ConfigError(f"refusing to listen on {host} with {why}: set "
                          "general_settings.master_key or TRIOGATE_MASTER_KEY")


def prepare_process(config: GatewayConfig, host: str | None) -> None:
    """What a gateway process does before it serves, whichever server runs it: warn of an
    open gateway, refuse an unsafe bind (``host``, when known), raise the open-files limit.

    Raises:
        ConfigError: see :func:`check_bind` and :func:`check_redis_url`.
    """
    check_redis_url(config.settings.redis.url)
    if config.master_key is None:
        logger.warning("no master_key configured: every request is accepted without a key")
    if host is not None:
        check_bind(config, host)
    before, after = raise_open_files_limit()  # --workers: the workers inherit it
    if after > before:
        logger.info("open-files limit raised from %d to %d", before, after)


def tune_gc() -> None:
    """Freeze what start-up allocated (imports, config, pools: never garbage) so full
    collections skip it, and collect less often (:data:`GC_THRESHOLDS`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def wall_clock_ms() -> int:
    """Epoch milliseconds: the one wall clock that feeds Redis scripts (tests inject theirs)."""
    return time.time_ns() // 1_000_000


@asynccontextmanager
async def open_gateway(
    config: GatewayConfig, *, clock_ms: Callable[[], int] = wall_clock_ms
) -> AsyncIterator[Services]:
    """Start every long-lived part of the gateway; drain and stop them on exit.

    Raises:
        ConfigError: (EmbeddedServerError) no server binary for the default mode.
    """
    state_dir = config.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    settings = config.settings
    if config.verbose:  # LiteLLM's set_verbose (logs are JSON lines already: json_logs)
        logger.setLevel(logging.DEBUG)
    async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
        url = settings.redis.url
        embedded = None
        if url is None:
            embedded = await stack.enter_async_context(open_embedded_server(state_dir / "redis"))
            url = embedded.url
        backend: RespBackend | ClusterBackend | SentinelBackend
        if ClusterBackend.is_cluster_url(url):
            backend = ClusterBackend(url, name="redis", pool_size=settings.redis.pool_size,
                                     command_timeout_s=settings.redis.timeout_s,
                                     wait_replicas=settings.redis.wait_replicas)
        elif SentinelBackend.is_sentinel_url(url):
            backend = SentinelBackend(url, name="redis", pool_size=settings.redis.pool_size,
                                      command_timeout_s=settings.redis.timeout_s,
                                      wait_replicas=settings.redis.wait_replicas)
            # A promoted replica has no scripts loaded (SCRIPT LOAD is not replicated).
            backend.add_switch_hook(partial(load_scripts, backend))
            await nursery.start(backend.watch)
        else:
            backend = RespBackend(url, name="redis", pool_size=settings.redis.pool_size,
                                  command_timeout_s=settings.redis.timeout_s)
        stack.push_async_callback(backend.aclose)
        await load_scripts(backend)
        backends = dict.fromkeys(BACKEND_NAMES, backend)
        tracer = MemoryTracer() if settings.tracing else None
        spans: SpanExporter | None = None
        if config.otel is not None:
            otel_client = httpx.AsyncClient()
            stack.push_async_callback(otel_client.aclose)
            spans = SpanExporter(config.otel, otel_client, inner=tracer)
            await nursery.start(spans.run)
        health = Health(liveness_grace_s=settings.redis.liveness_grace_s)
        if embedded is not None:
            # A restarted server has no scripts: load them again so the first request
            # after it still costs one wait (NOSCRIPT → EVAL would cover it anyway).
            embedded.add_restart_hook(partial(load_scripts, backend))
            health.embedded_down_since = embedded.down_since
            nursery.start_soon(embedded.supervise)
        metrics_box: list[Metrics] = []

        def settled(batch: PostCallBatch) -> None:
            if metrics_box:
                metrics_box[0].redis_waits_child("after").observe(batch.rounds)

        # Made here, not by Services: the settler asks it whether requests are in
        # their pre-call checks.
        gate = AdmissionGate(settings.max_admitting, settings.max_admission_wait_s)
        settler = Settler(
            backends, tracer=spans or tracer, journal=Journal(state_dir / "journal"),
            dead_letters=DeadLetterFile(state_dir / "dead-letter.jsonl"), scripts=lua_scripts(),
            on_settled=settled, clock_ms=clock_ms,
            merges=[budgets.SETTLE_MERGE] if settings.governance.merge_settlements else [],
            delay_s=settings.post_call_settle_delay_s,
            # Requests in their pre-call checks: a flush waits for them (bounded).
            busy=lambda: gate.admitting > 0,
        )
        await nursery.start(settler.run)
        providers = await stack.enter_async_context(
            build_providers(config, max_connections=settings.upstream_max_connections)
        )
        store = await stack.enter_async_context(
            open_store(config.database_url, state_dir=state_dir, now_ms=clock_ms)
        )
        identities = IdentityResolver(
            store, backend, backend.open_subscription,
            ttl_s=settings.governance.identity_ttl_s,
        )
        nursery.start_soon(identities.run)
        rotator = KeyRotator(store, identities, settings.key_rotation, clock_ms)
        await nursery.start(rotator.run)
        spend_logs = SpendLogWriter(
            store, interval_s=settings.spend_log_interval_s,
            batch_rows=settings.spend_log_batch_rows, fallback_dir=state_dir / "spendlog",
        )
        await nursery.start(spend_logs.run)

        router = Router(config, clock_ms=clock_ms)
        pacer = StreamPacer(settings.stream_coalesce_window_s)

        def gauges() -> dict[str, tuple[str, float]]:
            stats = settler.statistics()
            return {
                "triogate_settler_queue_depth": ("Post-call batches waiting.", stats.queued),
                "triogate_stream_holds": ("Times a stream waited between writes because the "
                                          "worker was behind, since start.", pacer.holds),
                "triogate_settler_flushes": ("Settler flushes so far.", stats.flushes),
                "triogate_settler_batches": ("Post-call batches settled so far.", stats.batches),
                "triogate_journal_pending": ("Journal entries awaiting replay.",
                                             stats.journal_pending),
                "triogate_journal_bytes": ("Bytes of journal entries awaiting replay.",
                                           stats.journal_bytes),
                "triogate_dead_letters": ("Post-call writes dead-lettered since start "
                                          "(state folder's dead-letter.jsonl).",
                                          stats.dead_lettered),
                "triogate_journal_write_errors": (
                    "Journal or dead-letter writes that failed (disk full) since start.",
                    stats.disk_errors),
                "triogate_settler_retried": ("Post-call writes journaled for a transient "
                                             "error reply since start.", stats.retried),
                "triogate_redis_up": ("1 when the last Redis check succeeded.",
                                      1.0 if health.redis_ok else 0.0),
                "triogate_spend_log_queue": ("Spend-log rows waiting to be written.",
                                             spend_logs.statistics().queued),
                "triogate_deployments_cooling_down": (
                    "Deployments this process knows to be cooling down.",
                    router.mirror.cooling(clock_ms())),
                "triogate_unannounced_changes": (
                    "Admin changes waiting for Redis to be announced.",
                    identities.unannounced),
                "triogate_spend_log_dead_letters": (
                    "Spend-log rows the database refused for their data, set aside.",
                    spend_logs.statistics().dead_lettered),
            }

        metrics = Metrics(gauges)
        metrics_box.append(metrics)
        features = config.governance
        checks = CheckSettings.from_config(
            settings.policies, settings.governance,
            proxy_limits=None if features.proxy_max_budget_nanousd is None else Limits(
                max_budget_nanousd=features.proxy_max_budget_nanousd,
                budget_duration_s=features.proxy_budget_duration_s))
        guardrails = alerts = None
        if features.guardrails or features.alert_webhook_url:
            side_client = httpx.AsyncClient()  # guardrail services and the alert webhook
            stack.push_async_callback(side_client.aclose)
            if features.guardrails:
                guardrails = Guardrails(features.guardrails, side_client)
            if features.alert_webhook_url:
                alerts = Alerts(features.alert_webhook_url, side_client, clock_ms,
                                backends=backends)
                await nursery.start(alerts.run)
        lease_keeper = LeaseKeeper(backends, checks, clock_ms)
        await nursery.start(lease_keeper.run)
        nursery.start_soon(pacer.run)
        services = Services(
            config=config,
            backends=backends,
            settler=settler,
            tracer=tracer,
            providers=providers,
            router=router,
            metrics=metrics,
            clock_ms=clock_ms,
            health=health,
            checks=checks,
            local=LocalGovernance(),
            leases=lease_keeper,
            gate=gate,
            pacer=pacer,
            identities=identities,
            store=store,
            spend_logs=spend_logs,
            spans=spans,
            guardrails=guardrails,
            alerts=alerts,
            cache=ResponseCache.from_settings(
                config.cache, scope=settings.cache.scope,
                max_entry_bytes=settings.cache.max_entry_bytes,
            ),
        )
        logger.info(
            "gateway ready",
            extra={"redis": redact_url(url), "deployments": len(config.deployments),
                   "state_dir": str(state_dir), "pid": os.getpid()},
        )
        try:
            yield services
        finally:
            with trio.CancelScope(shield=True) as drain:
                drain.deadline = trio.current_time() + settings.shutdown_grace_s
                await settler.wait_drained()
                await spend_logs.wait_drained()
                await identities.wait_announced()
                if alerts is not None:
                    alerts.close()
                    await alerts.wait_drained()
                if spans is not None:
                    await spans.aclose()
            if drain.cancelled_caught:
                # Nothing is lost: the settler journals and the writer spills what is left.
                logger.error("not drained within the grace period; journaling the rest")
            nursery.cancel_scope.cancel()


#: An idle kept-alive client connection is closed after this long.
KEEP_ALIVE_S = 75.0


def server_config(config: GatewayConfig) -> ServerConfig:
    """The HTTP server's settings for the gateway (its grace period is the shutdown grace)."""
    limit = open_files_limit()
    fits = connections_for(limit)
    wanted = config.settings.http.max_connections
    if wanted is not None and wanted > fits:
        logger.warning("triogate.http.max_connections %d does not fit the open-files limit "
                       "(%d: room for %d client connections with their upstream ones)",
                       wanted, limit, fits)
    return ServerConfig(
        max_connections=wanted or fits,
        keep_alive_s=KEEP_ALIVE_S,
        body_read_timeout_s=config.settings.http.body_read_timeout_s,
        body_total_timeout_s=config.settings.http.max_body_read_s,
        shutdown_grace_s=config.settings.shutdown_grace_s,
        backlog=LISTEN_BACKLOG,
        error_body=protocol_errors.error_body,  # 400/408/431/500: JSON body, x-request-id
    )


async def _signals(
    shutdown: trio.Event, force: trio.CancelScope, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """First SIGINT/SIGTERM: graceful shutdown. Second: stop waiting for requests.

    Even a forced stop loses no accounting: the settler journals what it still holds.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        task_status.started()
        async for signum in received:
            name = signal.Signals(signum).name
            if not shutdown.is_set():
                logger.info("shutting down", extra={"signal": name})
                shutdown.set()
            else:
                logger.warning("forced shutdown", extra={"signal": name})
                force.cancel()


async def _watch_parent(shutdown: trio.Event, parent_pid: int, interval_s: float = 0.5) -> None:
    """A supervised worker shuts down gracefully when its supervisor is gone.

    Workers run in sessions of their own (the supervisor forwards signals), so a
    supervisor killed outright would otherwise leave them serving forever.
    """
    while os.getppid() == parent_pid:  # noqa: ASYNC110 (no event tells a parent died)
        await trio.sleep(interval_s)
    logger.warning("supervisor gone; shutting down", extra={"parent_pid": parent_pid})
    shutdown.set()


async def serve(
    config: GatewayConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 4000,
    listen_fd: int | None = None,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    clock_ms: Callable[[], int] = wall_clock_ms,
    task_status: trio.TaskStatus[tuple[list[str], Services]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway until SIGINT/SIGTERM (or ``shutdown`` is set), then drain.

    ``listen_fd`` is an inherited listening socket (``--workers``: the supervisor binds
    once, every worker accepts on it). ``task_status.started`` gets the bound URLs and
    the services (tests use both).
    """
    shutdown = shutdown if shutdown is not None else trio.Event()
    settings = server_config(config)
    sock = socket.socket(fileno=listen_fd) if listen_fd is not None else None
    async with trio.open_nursery() as outer:
        if handle_signals:
            await outer.start(_signals, shutdown, outer.cancel_scope)
        if listen_fd is not None:
            outer.start_soon(_watch_parent, shutdown, os.getppid())
        async with open_gateway(config, clock_ms=clock_ms) as services:
            app = GatewayASGI(services)
            tune_gc()
            async with trio.open_nursery() as server:
                urls = await server.start(partial(
                    serve_http, app, settings, shutdown=shutdown, host=host, port=port,
                    sock=sock))
                task_status.started((urls, services))
            # The server returned: it stopped accepting and in-flight requests finished
            # (or hit the grace period). open_gateway's exit drains the settler.
        outer.cancel_scope.cancel()
