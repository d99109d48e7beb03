"""One call to an upstream through the API it speaks (its hub), whole or streamed.

The request is translated to the hub's shape (:mod:`.translate`), sent over the HTTP
boundary (:mod:`.http`), and the answer (or each streamed event, through
:mod:`.sse` and :mod:`.streaming`) translated back to the client's API.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from triogate.providers.http import (
    egress_of,
    open_sse_response,
    post_json,
    reply_shape,
    upstream_body,
)
from triogate.providers.http1 import DEFAULT_MAX_EVENT_BYTES
from triogate.providers.rawsse import CHAT, MESSAGES, RawStream
from triogate.providers.records import Completion, Usage
from triogate.providers.sse import SSESource, body_reader
from triogate.providers.streaming import Passthrough, TranslatedStream, check_streamable
from triogate.providers.tokens import count_output_tokens, estimate_input_tokens
from triogate.providers.translate import ChatPassthrough
from triogate.providers.transport import transport_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    import httpx

    from triogate.config import Deployment
    from triogate.providers.records import Api
    from triogate.providers.translate import Hub


async def complete_via_hub(
    client: httpx.AsyncClient,
    hub: Hub,
    api: Api,
    body: Mapping[str, Any],
    deployment: Deployment,
    *,
    url: str,
    headers: Mapping[str, str],
    created_s: int,
) -> Completion:
    """One non-streamed call through an upstream speaking ``hub`` (a checkpoint).

    The request is translated to the hub's shape, sent with the deployment's model and
    timeout, and the answer translated back. Usage the upstream did not report is
    counted (``reported=False``).

    Raises:
        ValueError: the request cannot be expressed in the hub's API (a client error).
        ProviderError: any upstream failure (see :func:`map_exceptions`).
    """
    request = upstream_body(hub.request(api, body, stream=False), deployment)
    response = await post_json(
        client, url, headers=headers, body=request, timeout_s=deployment.timeout_s,
        egress=egress_of(deployment),
    )
    with reply_shape():
        usage = hub.reported_usage(response) or Usage(
            input_tokens=estimate_input_tokens(api, body),
            output_tokens=count_output_tokens(hub.output_text(response)),
            reported=False,
        )
        out = hub.response(api, response, request=body, usage=usage, created_s=created_s)
    return Completion(body=out, usage=usage)


@contextlib.asynccontextmanager
async def open_hub_stream(
    client: httpx.AsyncClient,
    hub: Hub,
    api: Api,
    body: Mapping[str, Any],
    deployment: Deployment,
    *,
    url: str,
    headers: Mapping[str, str],
    created_s: int,
) -> AsyncIterator[TranslatedStream | RawStream]:
    """A streamed call through an upstream speaking ``hub``.

    Entering sends the request and checks the status (a checkpoint); leaving closes the
    upstream response, also when the client went away halfway.

    Raises:
        ProviderError: on entering (status, connect, timeout) or while iterating.
    """
    check_streamable(api)
    request = upstream_body(hub.request(api, body, stream=True), deployment)
    input_tokens = estimate_input_tokens(api, body)
    fast = transport_of(client)
    max_event = fast.max_event_bytes if fast is not None else DEFAULT_MAX_EVENT_BYTES
    async with open_sse_response(
        client, url, headers=headers, body=request, timeout_s=deployment.stream_timeout_s,
        egress=egress_of(deployment),
    ) as response:
        tracker = hub.tracker(input_tokens=input_tokens)
        translator = hub.translator(api, request=body, input_tokens=input_tokens,
                                    created_s=created_s)
        # The client speaks the upstream's API: the upstream's bytes go on (rawsse.py).
        if isinstance(translator, ChatPassthrough):
            yield RawStream(body_reader(response), tracker, translator, CHAT, max_event)
        elif isinstance(translator, Passthrough) and api == "messages":
            yield RawStream(body_reader(response), tracker, translator, MESSAGES, max_event)
        else:
            yield TranslatedStream(SSESource(response, max_event), tracker, translator)
