"""POST /v1/embeddings: cost from input tokens only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api import calls, flow, shapes, validate
from triogate.api.errors import ApiError
from triogate.api.validate import MAX_INT

if TYPE_CHECKING:
    from triogate.api.http import Request, Response
    from triogate.api.services import Services


def _token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def check_input(value: Any) -> None:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    ok = (
        (isinstance(value, str) and value != "")
        or (isinstance(value, list) and value and (
            all(isinstance(v, str) for v in value)
            or all(_token(v) for v in value)
            or all(isinstance(v, list) and v and all(_token(t) for t in v) for v in value)
        ))
    )
    if not ok:
        raise ApiError(400, "field 'input' must be a non-empty string, list of strings, "
                            "or list of token ids", param="input")


@calls.auth_first
async def create_embeddings(services: Services, request: Request) -> Response:
    """Validate, then run the common flow with api ``embeddings``."""
    body, group = await calls.read_body(services, request)
    if "input" not in body:
        raise ApiError(400, "missing required field 'input'", param="input")
    check_input(body["input"])
    shapes.embeddings(body)
    calls.check_mode(services, group, embedding=True)
    if body.get("stream"):
        raise ApiError(400, "embeddings cannot be streamed", param="stream")
    call = calls.make_call(
        services, request, body, api="embeddings", style="openai", group=group,
        output_tokens=0, end_user=validate.identifier(body.get("user"), "user"),
    )
    return await flow.serve(services, call)
