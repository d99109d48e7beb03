"""Liveness, readiness and metrics (the model list is in ``model_info``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from triogate.api.http import Response
from triogate.batch import BackendUnavailable
from triogate.errors import StoreError
from triogate.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from triogate.api.http import Request
    from triogate.api.services import Services


async def liveliness(services: Services, request: Request) -> Response:
    """The process answers: nothing else is checked."""
    await trio.lowlevel.checkpoint()
    return Response.json({"status": "alive"})


async def readiness(services: Services, request: Request) -> Response:
    """Redis and (when configured) SQL reachability.

    200 with ``"status": "degraded"`` when Redis is down: the gateway still serves,
    deciding from local state (fail-open) — pulling every instance out of a load balancer
    because the shared Redis blinked would turn a blip into an outage. ``?strict=1``
    answers 503 instead.
    """
    body: dict[str, object] = {"status": "ready"}
    backend = services.backends["counters"]
    try:
        await backend.execute([("PING",)])
        body["redis"] = "connected"
        services.health.redis_ok = True
    except BackendUnavailable as exc:
        body["redis"] = f"unavailable: {exc.reason}"
        services.health.redis_ok = False
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
    body["settler"] = {"queued": settler.queued, "journal_pending": settler.journal_pending}
    strict = request.query.get("strict") in ("1", "true")
    status = 503 if strict and body["status"] != "ready" else 200
    return Response.json(body, status=status)


async def metrics(services: Services, request: Request) -> Response:
    """Prometheus text format."""
    await trio.lowlevel.checkpoint()
    return Response(services.metrics.render(), content_type=CONTENT_TYPE)
