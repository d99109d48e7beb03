"""Liveness, readiness and metrics (the model list is in ``model_info``)."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

import trio

from triogate.api import auth
from triogate.api.errors import ApiError
from triogate.api.http import Response
from triogate.batch import BackendUnavailable, CommandError
from triogate.config import LITELLM_VERSION, TRIOGATE_VERSION
from triogate.errors import StoreError
from triogate.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from triogate.api.http import Request
    from triogate.api.services import Services


async def liveliness(services: Services, request: Request) -> Response:
    """The process answers, and its own embedded server (if any) answered recently.

    503 once the embedded server has not answered PING for ``redis.liveness_grace_s``
    (it is restarted when it dies, so this means it cannot be): a process in that state
    only serves degraded, and restarting it is the cure. An external Redis being down is
    readiness' business, never liveness'.
    """
    await trio.lowlevel.checkpoint()
    down_since = services.health.embedded_down_since
    since = down_since() if down_since is not None else None
    if since is not None:
        down_s = trio.current_time() - since
        if down_s > services.health.liveness_grace_s:
            return Response.json(
                {"status": "unhealthy",
                 "redis": f"embedded server not answering for {down_s:.0f} s"}, status=503)
    return Response.json({"status": "alive"})


async def readiness(services: Services, request: Request) -> Response:
    """Redis and (when configured) SQL reachability.

    Redis counts as ready when ``INFO persistence`` says ``loading:0``: a server still
    loading its AOF or RDB answers ``"redis": "loading"`` (and ``degraded``).

    ``degraded`` too while the settler cannot write its journal (disk full): post-call
    writes Redis did not take are kept in memory only.

    200 with ``"status": "degraded"`` when Redis is down: the gateway still serves,
    deciding from local state (fail-open) — pulling every instance out of a load balancer
    because the shared Redis blinked would turn a blip into an outage. ``?strict=1``
    answers 503 instead.
    """
    body: dict[str, object] = {"status": "ready", "triogate_version": TRIOGATE_VERSION,
                               "litellm_version": LITELLM_VERSION}
    backend = services.backends["counters"]
    try:
        # Not PING: a server loading its data set answers PING but refuses every write
        # with LOADING. INFO is served while loading and says so.
        (reply,) = await backend.execute([("INFO", "persistence")])
        state = redis_state(reply)
        body["redis"] = state
        services.health.redis_ok = state == "connected"
    except BackendUnavailable as exc:
        body["redis"] = f"unavailable: {exc.reason}"
        services.health.redis_ok = False
    if not services.health.redis_ok:
        body["status"] = "degraded"
    if services.store is not None:
        try:
            with trio.fail_after(services.config.settings.redis.timeout_s * 4):
                await services.store.ping()
            body["database"] = "connected"
        except (StoreError, trio.TooSlowError) as exc:
            body["database"] = f"unavailable: {type(exc).__name__}"
            body["status"] = "degraded"
    settler = services.settler.statistics()
    body["settler"] = {"queued": settler.queued, "journal_pending": settler.journal_pending,
                       "disk": "ok" if settler.disk_ok else "write failed"}
    if not settler.disk_ok:  # disk full: the journal is in memory only, still served
        body["status"] = "degraded"
    strict = request.query.get("strict") in ("1", "true")
    status = 503 if strict and body["status"] != "ready" else 200
    return Response.json(body, status=status)


def redis_state(info: object) -> str:
    """``"connected"``, ``"loading"`` or ``"unavailable: <reply>"`` from an ``INFO
    persistence`` reply (an error reply such as ``LOADING`` arrives as a CommandError)."""
    if isinstance(info, CommandError):
        return "loading" if info.reply.startswith("LOADING") else f"unavailable: {info.reply}"
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("loading:"):
            return "connected" if line.strip() == "loading:0" else "loading"
    return "connected"  # a server whose INFO has no such field (not Redis): it answered


async def metrics(services: Services, request: Request) -> Response:
    """Prometheus text format; behind ``triogate.http.metrics_key`` when it is set.

    Raises:
        ApiError: 401 when a metrics key is configured and the request has neither it
            nor the master key.
    """
    await trio.lowlevel.checkpoint()
    wanted = services.config.settings.http.metrics_key
    if wanted is not None:
        key = request.bearer()
        if key is None or not (hmac.compare_digest(key.encode(), wanted.encode())
                               or auth.is_master(services, key)):
            raise ApiError(401, "/metrics needs the metrics key: send "
                           "'Authorization: Bearer <key>'", "authentication_error")
    return Response(services.metrics.render(), content_type=CONTENT_TYPE)
