"""The translation table: any client API through an upstream's "hub" API and back.

An upstream speaks one hub: OpenAI chat completions (OpenAI-compatible servers, the mock)
or Anthropic messages. A :class:`Hub` knows, for each client API, how to turn a request
into the hub's shape, and the hub's response, stream events and usage back into the
client's. Chains are explicit: a Responses request to Anthropic goes
responses -> chat -> messages, and its stream messages -> chat -> responses.

The functions themselves live in :mod:`.translate_chat_messages` and
:mod:`.translate_responses`; everything here is pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import orjson

from triogate.errors import TranslationError
from triogate.providers.records import Usage
from triogate.providers.streaming import Chain, Passthrough, StreamTranslator
from triogate.providers.translate_chat_messages import (
    ChatToMessagesStream,
    MessagesToChatStream,
    chat_to_messages_request,
    chat_to_messages_response,
    messages_to_chat_request,
    messages_to_chat_response,
)
from triogate.providers.translate_responses import (
    ChatToResponsesStream,
    chat_to_responses_response,
    responses_to_chat_request,
)
from triogate.providers.usage import ChatUsageTracker, MessagesUsageTracker, UsageTracker

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.providers.records import Api

# Client-side fields that describe the *client's* stream; the hub decides its own.
_STREAM_FIELDS = ("stream", "stream_options")


class Hub(Protocol):
    """What a provider needs to speak any client API through its upstream's API."""

    name: str

    def request(self, api: Api, body: Mapping[str, Any], *, stream: bool) -> dict[str, Any]:
        """The client's request in the hub's shape (model still the client's)."""
        ...

    def response(
        self,
        api: Api,
        hub_response: Mapping[str, Any],
        *,
        request: Mapping[str, Any],
        usage: Usage,
        created_s: int,
    ) -> dict[str, Any]:
        """The hub's whole response in the client's shape, with ``usage`` in it."""
        ...

    def reported_usage(self, hub_response: Mapping[str, Any]) -> Usage | None: ...

    def output_text(self, hub_response: Mapping[str, Any]) -> str:
        """The generated text (and tool-call text), for counting when usage is missing."""
        ...

    def tracker(self, *, input_tokens: int) -> UsageTracker: ...

    def translator(
        self, api: Api, *, request: Mapping[str, Any], input_tokens: int, created_s: int
    ) -> StreamTranslator: ...


def _unsupported(api: str) -> TranslationError:
    return TranslationError(f"API {api!r} cannot be translated to a chat model")


def to_chat_request(api: Api, body: Mapping[str, Any]) -> dict[str, Any]:
    """Any chat-like client request as an OpenAI chat request."""
    if api == "chat":
        return dict(body)
    if api == "messages":
        return messages_to_chat_request(body)
    if api == "responses":
        return responses_to_chat_request(body)
    raise _unsupported(api)


def _with_usage(
    hub_response: Mapping[str, Any], usage: Usage, counted: dict[str, int]
) -> dict[str, Any]:
    """The native answer as the upstream sent it; counted usage only where it had none.

    A reported usage object goes to the client untouched (Anthropic's separate cache
    token fields, OpenAI's token details), since the client speaks that API.
    """
    if usage.reported:
        return dict(hub_response)
    return {**hub_response, "usage": counted}


class ChatHub:
    """OpenAI chat completions as the upstream's API."""

    name = "chat"

    def request(self, api: Api, body: Mapping[str, Any], *, stream: bool) -> dict[str, Any]:
        out = {k: v for k, v in to_chat_request(api, body).items() if k not in _STREAM_FIELDS}
        if stream:
            # Always ask for usage: without it, spend would rest on an estimate.
            out["stream"] = True
            out["stream_options"] = {"include_usage": True}
        return out

    def response(
        self,
        api: Api,
        hub_response: Mapping[str, Any],
        *,
        request: Mapping[str, Any],
        usage: Usage,
        created_s: int,
    ) -> dict[str, Any]:
        if api == "chat":
            return _with_usage(hub_response, usage, usage.to_chat())
        if api == "messages":
            return chat_to_messages_response(hub_response, usage=usage)
        if api == "responses":
            return chat_to_responses_response(
                hub_response, request=request, usage=usage, created_s=created_s
            )
        raise _unsupported(api)

    def reported_usage(self, hub_response: Mapping[str, Any]) -> Usage | None:
        return Usage.from_chat(hub_response.get("usage"))

    def output_text(self, hub_response: Mapping[str, Any]) -> str:
        pieces: list[str] = []
        for choice in hub_response.get("choices") or ():
            message = choice.get("message") or {}
            if isinstance(message.get("content"), str):
                pieces.append(message["content"])
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                pieces += [str(function.get("name", "")), str(function.get("arguments", ""))]
        return "".join(pieces)

    def tracker(self, *, input_tokens: int) -> UsageTracker:
        return ChatUsageTracker(input_tokens=input_tokens)

    def translator(
        self, api: Api, *, request: Mapping[str, Any], input_tokens: int, created_s: int
    ) -> StreamTranslator:
        if api == "chat":
            return ChatPassthrough(created_s=created_s)
        if api == "messages":
            return ChatToMessagesStream(input_tokens=input_tokens, model=request.get("model"))
        if api == "responses":
            return ChatToResponsesStream(request=request, created_s=created_s)
        raise _unsupported(api)


class MessagesHub:
    """Anthropic messages as the upstream's API."""

    name = "messages"

    def request(self, api: Api, body: Mapping[str, Any], *, stream: bool) -> dict[str, Any]:
        if api == "messages":
            out = dict(body)
        else:
            out = chat_to_messages_request(to_chat_request(api, body))
        out.pop("stream", None)
        if stream:
            out["stream"] = True
        return out

    def response(
        self,
        api: Api,
        hub_response: Mapping[str, Any],
        *,
        request: Mapping[str, Any],
        usage: Usage,
        created_s: int,
    ) -> dict[str, Any]:
        if api == "messages":
            return _with_usage(hub_response, usage, usage.to_messages())
        chat = messages_to_chat_response(hub_response, usage=usage, created_s=created_s)
        if api == "chat":
            return chat
        if api == "responses":
            return chat_to_responses_response(
                chat, request=request, usage=usage, created_s=created_s
            )
        raise _unsupported(api)

    def reported_usage(self, hub_response: Mapping[str, Any]) -> Usage | None:
        return Usage.from_messages(hub_response.get("usage"))

    def output_text(self, hub_response: Mapping[str, Any]) -> str:
        pieces: list[str] = []
        for block in hub_response.get("content") or ():
            if isinstance(block.get("text"), str):
                pieces.append(block["text"])
            if block.get("type") == "tool_use":
                pieces += [str(block.get("name", "")), orjson.dumps(block.get("input")).decode()]
        return "".join(pieces)

    def tracker(self, *, input_tokens: int) -> UsageTracker:
        return MessagesUsageTracker(input_tokens=input_tokens)

    def translator(
        self, api: Api, *, request: Mapping[str, Any], input_tokens: int, created_s: int
    ) -> StreamTranslator:
        if api == "messages":
            return Passthrough()
        to_chat = MessagesToChatStream(created_s=created_s, model=request.get("model"))
        if api == "chat":
            return to_chat
        if api == "responses":
            return Chain(to_chat, ChatToResponsesStream(request=request, created_s=created_s))
        raise _unsupported(api)


class ChatPassthrough:
    """Chat chunks through untouched, plus a usage chunk if the upstream sent none."""

    def __init__(self, *, created_s: int) -> None:
        self._created_s = created_s
        self._id: Any = None
        self._model: Any = None
        self._usage_seen = False

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        self.observe(event)
        return [dict(event)]

    def observe(self, event: Mapping[str, Any]) -> None:
        """What ``finish`` needs of an event that goes on as it is (``rawsse.py``)."""
        self._id = event.get("id", self._id)
        self._model = event.get("model", self._model)
        if isinstance(event.get("usage"), dict):
            self._usage_seen = True

    def finish(self, usage: Usage) -> list[dict[str, Any]]:
        if self._usage_seen:
            return []
        chunk = {
            "id": self._id or "chatcmpl-unknown",
            "object": "chat.completion.chunk",
            "created": self._created_s,
            "model": self._model,
            "choices": [],
            "usage": usage.to_chat(),
        }
        return [chunk]
