"""POST /v1/chat/completions (OpenAI's shape), streaming or not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api import calls, flow, multi, shapes, validate
from triogate.api.errors import ApiError

if TYPE_CHECKING:
    from triogate.api.http import Request, Response
    from triogate.api.services import Services

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def check_messages(body: dict[str, Any]) -> None:
    """``messages``: a non-empty list of objects with a known role."""
    messages = validate.field(body, "messages", list, required=True, what="a list")
    if not messages:
        raise ApiError(400, "field 'messages' must not be empty", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(sorted(_ROLES))}",
                           param=f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of parts",
                           param=f"messages[{i}].content")


@calls.auth_first
async def chat_completions(services: Services, request: Request) -> Response:
    """Validate, then run the common flow with api ``chat`` (once per model of a
    comma-separated ``model``: ``multi.py``)."""
    body = await request.json(services.config.settings.max_body_bytes)
    names = multi.models_of(body)
    if names is not None:
        return await multi.fan_out(services, request, body, names, _one)
    return await _one(services, request)  # its json() answers the same body


async def _one(services: Services, request: Request) -> Response:
    body, group = await calls.read_body(services, request)
    check_messages(body)
    shapes.chat(body)
    stream_options = validate.field(body, "stream_options", dict, what="an object") or {}
    validate.number_between(body, "temperature", 0, 2)
    validate.number_between(body, "top_p", 0, 1)
    calls.check_mode(services, group, embedding=False)
    call = calls.make_call(
        services, request, body, api="chat", style="openai", group=group,
        output_tokens=calls.output_estimate(services, body, "max_tokens",
                                            "max_completion_tokens"),
        end_user=validate.identifier(body.get("user"), "user"),
        include_usage=bool(stream_options.get("include_usage")),
    )
    return await flow.serve(services, call)
