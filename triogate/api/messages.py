"""POST /v1/messages (Anthropic's shape), streaming or not; errors in Anthropic's shape."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api import calls, flow, shapes, validate
from triogate.api.errors import ApiError

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
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(role, str) or role not in _ROLES:
            raise ApiError(400, f"messages.{i}.role: must be 'user' or 'assistant'",
                           param=f"messages.{i}.role")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise ApiError(400, f"messages.{i}.content: must be a string or a list of blocks",
                           param=f"messages.{i}.content")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise ApiError(400, "system: must be a string or a list of text blocks", param="system")


def upstream_body(body: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` keeps only Anthropic's own ``user_id`` (the gateway reads the rest)."""
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        return {**sent, "metadata": {"user_id": metadata["user_id"]}}
    return sent


@calls.auth_first
async def create_message(services: Services, request: Request) -> Response:
    """Validate, then run the common flow with api ``messages``."""
    body, group = await calls.read_body(services, request)
    if validate.positive_int(body, "max_tokens") is None:
        raise ApiError(400, "max_tokens: field required", param="max_tokens")
    check_messages(body)
    shapes.messages(body)
    validate.number_between(body, "temperature", 0, 1)
    validate.number_between(body, "top_p", 0, 1)
    metadata = validate.field(body, "metadata", dict, what="an object") or {}
    end_user = validate.identifier(metadata.get("user_id"), "metadata.user_id")
    calls.check_mode(services, group, embedding=False)
    call = calls.make_call(
        services, request, body, api="messages", style="anthropic", group=group,
        output_tokens=calls.output_estimate(services, body, "max_tokens"),
        end_user=end_user,
        upstream=upstream_body(body, calls.upstream_body(services, group, body)),
    )
    return await flow.serve(services, call)
