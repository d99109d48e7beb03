"""``GET /health``: call every deployment (LiteLLM's upstream health check), proxy admins
only (the master key, or a ``proxy_admin`` user's key).

Each deployment gets one tiny request (a one-token chat completion, or a one-word
embedding), all at once in a nursery, each bounded by ``HEALTH_TIMEOUT_S`` (or the
deployment's own timeout when shorter). ``?model=`` checks one group. Wildcard
deployments are not called: there is no model to ask for (they are listed as skipped).
The answer never carries an api key, and errors are the gateway's words, not the
upstream's body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import trio

from triogate.api.admin.roles import HEALTH_RULE, authorize
from triogate.api.errors import ApiError, from_provider
from triogate.api.http import Response
from triogate.api.model_info import deployment_info
from triogate.errors import ProviderError

if TYPE_CHECKING:
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.config import Deployment

#: Upper bound of one deployment's check.
HEALTH_TIMEOUT_S = 10.0
_PING_CHAT = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
_PING_EMBED = {"input": "ping"}


async def _check(services: Services, deployment: Deployment) -> str | None:
    """None when the deployment answered; else what went wrong."""
    timeout_s = min(HEALTH_TIMEOUT_S, deployment.timeout_s)
    bounded = attrs.evolve(deployment, timeout_s=timeout_s)
    provider = services.providers[deployment.provider]
    embedding = deployment.mode == "embedding"
    body = {"model": deployment.group, **(_PING_EMBED if embedding else _PING_CHAT)}
    with trio.move_on_after(timeout_s + 1) as scope:
        try:
            await provider.complete("embeddings" if embedding else "chat", body, bounded)
        except ProviderError as exc:
            return from_provider(exc).message
        except ValueError as exc:
            return str(exc)
    if scope.cancelled_caught:
        return f"no answer within {timeout_s:g} s"
    return None


async def health(services: Services, request: Request) -> Response:
    """Check every deployment (or ``?model=``'s) in parallel; 200 with the findings."""
    await authorize(services, request, HEALTH_RULE)
    wanted = request.query.get("model")
    if wanted is not None and wanted not in services.config.groups:
        raise ApiError(404, f"model '{wanted}' is not a model group here", "not_found_error",
                       param="model", code="model_not_found")
    deployments = [d for d in services.config.deployments
                   if wanted is None or d.group == wanted]
    results: dict[str, str | None] = {}

    async def run(deployment: Deployment) -> None:
        results[deployment.id] = await _check(services, deployment)

    async with trio.open_nursery() as nursery:
        for d in deployments:
            if not d.wildcard:
                nursery.start_soon(run, d)
    healthy: list[dict[str, Any]] = []
    unhealthy: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for d in deployments:
        info = deployment_info(d)
        entry = {"model_name": d.group, "model_id": d.id, **info["litellm_params"]}
        if d.wildcard:
            skipped.append(entry)
        elif results.get(d.id) is None:
            healthy.append(entry)
        else:
            unhealthy.append({**entry, "error": results[d.id]})
    return Response.json({
        "healthy_endpoints": healthy, "unhealthy_endpoints": unhealthy,
        "skipped_endpoints": skipped, "healthy_count": len(healthy),
        "unhealthy_count": len(unhealthy),
    }, headers={"cache-control": "no-store"})


