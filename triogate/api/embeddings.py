"""POST /v1/embeddings: cost from input tokens only."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from triogate.api import flow, validate
from triogate.api.chat import end_user_of, upstream_body
from triogate.api.errors import ApiError
from triogate.providers.tokens import estimate_input_tokens

if TYPE_CHECKING:
    from triogate.api.http import Request, Response
    from triogate.api.services import Services


def check_input(value: Any) -> None:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    ok = (
        (isinstance(value, str) and value != "")
        or (isinstance(value, list) and value and (
            all(isinstance(v, str) for v in value)
            or all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or all(isinstance(v, list) and all(isinstance(t, int) for t in v) for v in value)
        ))
    )
    if not ok:
        raise ApiError(400, "field 'input' must be a non-empty string, list of strings, "
                            "or list of token ids", param="input")


async def create_embeddings(services: Services, request: Request) -> Response:
    """Validate, then run the common flow with api ``embeddings``."""
    body = await request.json(services.config.settings.max_body_bytes)
    group = validate.model_name(body, services.config.groups)
    if "input" not in body:
        raise ApiError(400, "missing required field 'input'", param="input")
    check_input(body["input"])
    validate.positive_int(body, "dimensions")
    deployments = services.config.groups[group]
    if not any(d.mode == "embedding" for d in deployments):
        raise ApiError(400, f"model '{group}' is not an embedding model", param="model")
    if body.get("stream"):
        raise ApiError(400, "embeddings cannot be streamed", param="stream")
    call = flow.Call(
        api="embeddings",
        route="embeddings",
        style="openai",
        body=upstream_body(body, any(d.provider == "mock" for d in deployments)),
        group=group,
        stream=False,
        request=request,
        cache=validate.cache_control(body, request.headers),
        trace_id=uuid.uuid4().hex,
        end_user=end_user_of(services, request, body),
        tags=validate.tags_of(body),
        input_tokens=estimate_input_tokens("embeddings", body),
        output_tokens=0,
    )
    return await flow.serve(services, call)
