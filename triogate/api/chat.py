"""POST /v1/chat/completions (OpenAI's shape), streaming or not."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from triogate.api import flow, validate
from triogate.api.errors import ApiError
from triogate.providers.tokens import estimate_input_tokens

if TYPE_CHECKING:
    from triogate.api.http import Request, Response
    from triogate.api.services import Services

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

#: Fields the gateway reads and does not pass upstream.
GATEWAY_FIELDS = ("cache", "metadata", "mock_response")


def check_messages(body: dict[str, Any]) -> None:
    """``messages``: a non-empty list of objects with a known role."""
    messages = validate.field(body, "messages", list, required=True, what="a list")
    if not messages:
        raise ApiError(400, "field 'messages' must not be empty", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if role not in _ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(sorted(_ROLES))}",
                           param=f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of parts",
                           param=f"messages[{i}].content")


def output_estimate(services: Services, body: dict[str, Any], *names: str) -> int:
    """Output tokens to reserve: max_tokens (or the default), capped, times ``n``."""
    settings = services.config.settings.governance
    requested = None
    for name in names:
        requested = validate.positive_int(body, name) or requested
    n = validate.positive_int(body, "n") or 1
    per_choice = min(requested or settings.default_max_output_tokens,
                     settings.max_reserved_output_tokens)
    return per_choice * n


def end_user_of(services: Services, request: Request, body: dict[str, Any]) -> str | None:
    """The end user: the body's ``user`` field, else the configured header."""
    user = validate.field(body, "user", str, what="a string")
    return user or request.headers.get(services.config.settings.governance.end_user_header)


def upstream_body(body: dict[str, Any], group_deployments_mock: bool) -> dict[str, Any]:
    """The body without gateway-only fields (``mock_response`` stays for mock deployments)."""
    drop = GATEWAY_FIELDS if not group_deployments_mock else ("cache", "metadata")
    return {k: v for k, v in body.items() if k not in drop}


async def chat_completions(services: Services, request: Request) -> Response:
    """Validate, then run the common flow with api ``chat``."""
    body = await request.json(services.config.settings.max_body_bytes)
    group = validate.model_name(body, services.config.groups)
    check_messages(body)
    stream = bool(validate.field(body, "stream", bool, what="a boolean"))
    stream_options = validate.field(body, "stream_options", dict, what="an object") or {}
    validate.number_between(body, "temperature", 0, 2)
    validate.number_between(body, "top_p", 0, 1)
    deployments = services.config.groups[group]
    if all(d.mode == "embedding" for d in deployments):
        raise ApiError(400, f"model '{group}' is an embedding model", param="model")
    call = flow.Call(
        api="chat",
        route="chat",
        style="openai",
        body=upstream_body(body, any(d.provider == "mock" for d in deployments)),
        group=group,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage")),
        request=request,
        cache=validate.cache_control(body, request.headers),
        trace_id=uuid.uuid4().hex,
        end_user=end_user_of(services, request, body),
        tags=validate.tags_of(body),
        input_tokens=estimate_input_tokens("chat", body),
        output_tokens=output_estimate(services, body, "max_tokens", "max_completion_tokens"),
    )
    return await flow.serve(services, call)
