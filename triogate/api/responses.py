"""POST /v1/responses (OpenAI's Responses API): text input and output, streaming or not."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.api import calls, flow, shapes, validate
from triogate.api.errors import ApiError

if TYPE_CHECKING:
    from triogate.api.http import Request, Response
    from triogate.api.services import Services


@calls.auth_first
async def create_response(services: Services, request: Request) -> Response:
    """Validate, then run the common flow with api ``responses``."""
    body, group = await calls.read_body(services, request)
    value = body.get("input")
    if value is None:
        raise ApiError(400, "missing required field 'input'", param="input")
    if not isinstance(value, (str, list)) or value == "" or value == []:
        raise ApiError(400, "field 'input' must be a non-empty string or list of items",
                       param="input")
    validate.field(body, "instructions", str, what="a string")
    shapes.responses(body)
    validate.number_between(body, "temperature", 0, 2)
    validate.number_between(body, "top_p", 0, 1)
    calls.check_mode(services, group, embedding=False)
    call = calls.make_call(
        services, request, body, api="responses", style="openai", group=group,
        output_tokens=calls.output_estimate(services, body, "max_output_tokens"),
        end_user=validate.identifier(body.get("user"), "user"),
    )
    return await flow.serve(services, call)
