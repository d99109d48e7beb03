"""POST /v1/messages (Anthropic's shape), streaming or not; errors in Anthropic's shape."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from triogate.api import flow, validate
from triogate.api.chat import output_estimate
from triogate.api.errors import ApiError
from triogate.providers.tokens import estimate_input_tokens

if TYPE_CHECKING:
    from triogate.api.http import Request, Response
    from triogate.api.services import Services

_ROLES = frozenset({"user", "assistant"})


def check_messages(body: dict[str, Any]) -> None:
    """Anthropic's rules: a non-empty list of user/assistant turns, content str or blocks."""
    messages = validate.field(body, "messages", list, required=True, what="a list")
    if not messages:
        raise ApiError(400, "messages: at least one message is required", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ApiError(400, f"messages.{i}.role: must be 'user' or 'assistant'",
                           param=f"messages.{i}.role")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise ApiError(400, f"messages.{i}.content: must be a string or a list of blocks",
                           param=f"messages.{i}.content")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise ApiError(400, "system: must be a string or a list of text blocks", param="system")


def upstream_body(body: dict[str, Any], mock: bool) -> dict[str, Any]:
    """Without gateway-only fields; ``metadata`` keeps only Anthropic's ``user_id``."""
    out = {k: v for k, v in body.items() if k not in ("cache", "metadata", "mock_response")}
    if mock and "mock_response" in body:
        out["mock_response"] = body["mock_response"]
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        out["metadata"] = {"user_id": metadata["user_id"]}
    return out


async def create_message(services: Services, request: Request) -> Response:
    """Validate, then run the common flow with api ``messages``."""
    body = await request.json(services.config.settings.max_body_bytes)
    group = validate.model_name(body, services.config.groups)
    if validate.positive_int(body, "max_tokens") is None:
        raise ApiError(400, "max_tokens: field required", param="max_tokens")
    check_messages(body)
    stream = bool(validate.field(body, "stream", bool, what="a boolean"))
    validate.number_between(body, "temperature", 0, 1)
    validate.number_between(body, "top_p", 0, 1)
    metadata = validate.field(body, "metadata", dict, what="an object") or {}
    end_user = metadata.get("user_id") if isinstance(metadata.get("user_id"), str) else None
    deployments = services.config.groups[group]
    if all(d.mode == "embedding" for d in deployments):
        raise ApiError(400, f"model '{group}' is an embedding model", param="model")
    call = flow.Call(
        api="messages",
        route="messages",
        style="anthropic",
        body=upstream_body(body, any(d.provider == "mock" for d in deployments)),
        group=group,
        stream=stream,
        request=request,
        cache=validate.cache_control(body, request.headers),
        trace_id=uuid.uuid4().hex,
        end_user=end_user or request.headers.get(
            services.config.settings.governance.end_user_header),
        tags=validate.tags_of(body),
        input_tokens=estimate_input_tokens("messages", body),
        output_tokens=output_estimate(services, body, "max_tokens"),
    )
    return await flow.serve(services, call)
