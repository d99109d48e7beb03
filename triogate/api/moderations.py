"""POST /v1/moderations: OpenAI's moderation API, passed to an OpenAI-compatible
deployment whose ``model_info.mode`` is ``moderation`` (LiteLLM's ``mode: moderation``).

``model`` names the moderation group; without one, the request goes to the only
moderation group configured (400 when there are several, or none). The request is
governed like any other (key access, budgets, rate limits: its input tokens are counted,
its cost is the deployment's price, zero unless the config sets one) and gets a spend
row. Streaming does not exist for moderations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.api import calls, flow, validate
from triogate.api.errors import ApiError
from triogate.api.rebody import with_body

if TYPE_CHECKING:
    from triogate.api.http import Request, Response
    from triogate.api.services import Services

MODE = "moderation"


def _moderation_groups(services: Services) -> list[str]:
    return [g for g, ds in services.groups.items() if ds and all(d.mode == MODE for d in ds)]


@calls.auth_first
async def create_moderation(services: Services, request: Request) -> Response:
    """Validate, then run the common flow with api ``moderations``."""
    body = await request.json(services.config.settings.max_body_bytes)
    value = body.get("input")
    if value is None:
        raise ApiError(400, "missing required field 'input'", param="input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(
            isinstance(t, (str, dict)) for t in texts):
        raise ApiError(400, "field 'input' must be a string, a list of strings, or a list "
                       "of input parts", param="input")
    if body.get("stream"):
        raise ApiError(400, "moderations cannot be streamed", param="stream")
    if body.get("model") is None:
        groups = _moderation_groups(services)
        if len(groups) != 1:
            raise ApiError(400, "field 'model' is required: name one of the moderation "
                           f"models ({', '.join(groups) or 'none is configured'})",
                           param="model")
        body = {**body, "model": groups[0]}
    body, group = await calls.read_body(services, with_body(request, body))
    if group not in _moderation_groups(services):
        raise ApiError(400, f"model '{group}' is not a moderation model (its deployments "
                       "need model_info.mode: moderation)", param="model")
    call = calls.make_call(
        services, request, body, api="moderations", style="openai", group=group,
        output_tokens=0, end_user=validate.identifier(body.get("user"), "user"),
    )
    return await flow.serve(services, call)


