"""POST /v1/responses (OpenAI's Responses API): text input and output, streaming or not."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from triogate.api import flow, validate
from triogate.api.chat import end_user_of, output_estimate, upstream_body
from triogate.api.errors import ApiError
from triogate.providers.tokens import estimate_input_tokens

if TYPE_CHECKING:
    from triogate.api.http import Request, Response
    from triogate.api.services import Services


async def create_response(services: Services, request: Request) -> Response:
    """Validate, then run the common flow with api ``responses``."""
    body = await request.json(services.config.settings.max_body_bytes)
    group = validate.model_name(body, services.config.groups)
    value = body.get("input")
    if value is None:
        raise ApiError(400, "missing required field 'input'", param="input")
    if not isinstance(value, (str, list)) or value == "" or value == []:
        raise ApiError(400, "field 'input' must be a non-empty string or list of items",
                       param="input")
    validate.field(body, "instructions", str, what="a string")
    stream = bool(validate.field(body, "stream", bool, what="a boolean"))
    validate.number_between(body, "temperature", 0, 2)
    validate.number_between(body, "top_p", 0, 1)
    deployments = services.config.groups[group]
    if all(d.mode == "embedding" for d in deployments):
        raise ApiError(400, f"model '{group}' is an embedding model", param="model")
    call = flow.Call(
        api="responses",
        route="responses",
        style="openai",
        body=upstream_body(body, any(d.provider == "mock" for d in deployments)),
        group=group,
        stream=stream,
        request=request,
        cache=validate.cache_control(body, request.headers),
        trace_id=uuid.uuid4().hex,
        end_user=end_user_of(services, request, body),
        tags=validate.tags_of(body),
        input_tokens=estimate_input_tokens("responses", body),
        output_tokens=output_estimate(services, body, "max_output_tokens"),
    )
    return await flow.serve(services, call)
