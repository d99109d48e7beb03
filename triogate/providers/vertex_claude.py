"""Anthropic's Claude models on Vertex AI (``vertex_ai/claude-…``).

Vertex AI serves them with Anthropic's Messages API at the publisher ``anthropic``:
``…/publishers/anthropic/models/{model}:rawPredict`` (``:streamRawPredict`` for streams),
the model named in the URL only and ``anthropic_version: vertex-2023-10-16`` in the body.
The translation is the Anthropic provider's (:class:`~triogate.providers.translate.
MessagesHub`); the URL and the bearer token are the Vertex AI provider's.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from triogate.providers.cloud_errors import cloud_errors
from triogate.providers.http import (
    egress_of,
    open_sse_response,
    post_json,
    reply_shape,
)
from triogate.providers.records import GATEWAY_ONLY_FIELDS, Completion, Usage
from triogate.providers.sse import SSESource
from triogate.providers.streaming import TranslatedStream
from triogate.providers.tokens import count_output_tokens, estimate_input_tokens
from triogate.providers.translate import MessagesHub

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    import httpx

    from triogate.config import Deployment
    from triogate.providers.records import Api

VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"
_HUB = MessagesHub()


def is_claude(model: str) -> bool:
    """Whether a Vertex AI model is one of Anthropic's (served by the Messages API)."""
    return model.removeprefix("models/").startswith("claude")


def request_body(api: Api, body: Mapping[str, Any], *, stream: bool) -> dict[str, Any]:
    """The client's request as a Vertex AI Messages request (no ``model`` field).

    Raises:
        TranslationError: what the Messages API cannot express.
    """
    out = {k: v for k, v in _HUB.request(api, body, stream=stream).items()
           if k not in GATEWAY_ONLY_FIELDS and k != "model"}
    out["anthropic_version"] = VERTEX_ANTHROPIC_VERSION
    return out


async def complete(client: httpx.AsyncClient, api: Api, body: Mapping[str, Any],
                   request: dict[str, Any], deployment: Deployment, *, url: str,
                   headers: Mapping[str, str], created_s: int) -> Completion:
    """One ``rawPredict`` call, answered in the client's API (a checkpoint)."""
    with cloud_errors():
        response = await post_json(client, url, headers=headers, body=request,
                                   timeout_s=deployment.timeout_s, egress=egress_of(deployment))
    with reply_shape():
        usage = _HUB.reported_usage(response) or Usage(
            input_tokens=estimate_input_tokens(api, body),
            output_tokens=count_output_tokens(_HUB.output_text(response)), reported=False)
        out = _HUB.response(api, response, request=body, usage=usage, created_s=created_s)
    return Completion(body=out, usage=usage)


@contextlib.asynccontextmanager
async def stream(client: httpx.AsyncClient, api: Api, body: Mapping[str, Any],
                 request: dict[str, Any], deployment: Deployment, *, url: str,
                 headers: Mapping[str, str], created_s: int) -> AsyncIterator[TranslatedStream]:
    """A ``streamRawPredict`` stream (Anthropic's events), translated to ``api``'s."""
    input_tokens = estimate_input_tokens(api, body)
    async with contextlib.AsyncExitStack() as stack:
        with cloud_errors():
            response = await stack.enter_async_context(open_sse_response(
                client, url, headers=headers, body=request,
                timeout_s=deployment.stream_timeout_s,
                    egress=egress_of(deployment)))
        translator = _HUB.translator(api, request=body, input_tokens=input_tokens,
                                     created_s=created_s)
        yield TranslatedStream(SSESource(response), _HUB.tracker(input_tokens=input_tokens),
                               translator)
