"""The official SDKs as judges of our streams: feed them SSE bytes, take their final object.

Each helper serves ``events`` as one streamed HTTP response through httpx.MockTransport
(no sockets) and lets the SDK's own streaming helper parse, validate and accumulate it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import httpx2
import openai
import orjson

if TYPE_CHECKING:
    from collections.abc import Sequence

    from anthropic.types import Message
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response


def sse(api: str, events: Sequence[dict[str, Any]]) -> bytes:
    """The events framed as each API frames them (chat: ``data:`` lines and ``[DONE]``)."""
    out = bytearray()
    for event in events:
        data = orjson.dumps(event)
        if api == "chat":
            out += b"data: " + data + b"\n\n"
        else:
            out += b"event: " + str(event["type"]).encode() + b"\ndata: " + data + b"\n\n"
    if api == "chat":
        out += b"data: [DONE]\n\n"
    return bytes(out)


def _client(api: str, events: Sequence[dict[str, Any]]) -> httpx.Client:
    body = sse(api, events)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return httpx.Client(transport=httpx.MockTransport(handler))


def _client2(events: Sequence[dict[str, Any]]) -> httpx2.Client:
    """The anthropic SDK ships its own httpx fork (``httpx2``); same seam, its own types."""
    body = sse("messages", events)

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def openai_chat(events: Sequence[dict[str, Any]]) -> ChatCompletion:
    """What ``client.chat.completions.stream(...).get_final_completion()`` makes of them."""
    client = openai.OpenAI(api_key="sk-test", base_url="http://gw.test/v1",
                           http_client=_client("chat", events))
    with client.chat.completions.stream(
        model="m", messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        for _ in stream:
            pass
        if any(c.finish_reason == "length" for c in stream.current_completion_snapshot.choices):
            # get_final_completion refuses to parse a cut-off answer; the snapshot is the
            # same accumulation without that parsing step.
            return stream.current_completion_snapshot  # type: ignore[return-value]
        return stream.get_final_completion()


def anthropic_message(events: Sequence[dict[str, Any]]) -> Message:
    """What ``client.messages.stream(...).get_final_message()`` makes of them."""
    client = anthropic.Anthropic(api_key="sk-test", base_url="http://gw.test",
                                 http_client=_client2(events))
    with client.messages.stream(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        for _ in stream:
            pass
        return stream.get_final_message()


def openai_response(events: Sequence[dict[str, Any]]) -> Response:
    """What ``client.responses.stream(...).get_final_response()`` makes of them."""
    client = openai.OpenAI(api_key="sk-test", base_url="http://gw.test/v1",
                           http_client=_client("responses", events))
    incomplete: Response | None = None
    with client.responses.stream(model="m", input="hi") as stream:
        for event in stream:
            if event.type == "response.incomplete":
                incomplete = event.response
        if incomplete is not None:
            # The helper only finishes on response.completed; a cut-off answer ends in
            # response.incomplete, whose response the SDK has validated all the same.
            return incomplete
        return stream.get_final_response()


def sdk_final(api: str, events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The SDK's final object for ``api``, as a plain dict (fields it set only)."""
    if api == "chat":
        final: Any = openai_chat(events)
    elif api == "messages":
        final = anthropic_message(events)
    else:
        final = openai_response(events)
    return final.to_dict()  # type: ignore[no-any-return]
