"""Providers whose upstream speaks neither chat nor messages reach the client through chat.

A cloud provider (Gemini, Vertex AI, Bedrock) turns its upstream's answers into OpenAI chat
completions, and its streamed events into chat chunks (its own :class:`ChatEventSource`);
from there the chat hub (:class:`~triogate.providers.translate.ChatHub`) answers in the
client's API, as for an OpenAI-compatible upstream. The request goes the other way: the
client's API to chat here, chat to the upstream's shape in the provider.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Protocol

import trio

from triogate.errors import ProviderError, ProviderProtocolError
from triogate.providers.http import SHAPE_ERRORS
from triogate.providers.records import Completion, Usage
from triogate.providers.streaming import TranslatedStream
from triogate.providers.tokens import count_output_tokens, estimate_input_tokens
from triogate.providers.translate import ChatHub
from triogate.providers.usage import ChatUsageTracker

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.providers.records import Api
    from triogate.providers.streaming import StreamTranslator

_HUB = ChatHub()
_DROPPED = ("stream", "stream_options", "model")


def chat_request(api: Api, body: Mapping[str, Any]) -> dict[str, Any]:
    """The client's request as an OpenAI chat request (no model, no stream fields).

    Raises:
        TranslationError: the client's API has no chat form.
    """
    return {k: v for k, v in _HUB.request(api, body, stream=False).items() if k not in _DROPPED}


def answer(
    api: Api,
    chat_response: dict[str, Any],
    *,
    request: Mapping[str, Any],
    usage: Usage | None,
    created_s: int,
) -> Completion:
    """A chat completion made from the upstream's answer, in the client's API.

    ``usage`` None: the upstream reported none, so it is counted.
    """
    if usage is None:
        usage = Usage(input_tokens=estimate_input_tokens(api, request),
                      output_tokens=count_output_tokens(_HUB.output_text(chat_response)),
                      reported=False)
        chat_response["usage"] = usage.to_chat()
    body = _HUB.response(api, chat_response, request=request, usage=usage, created_s=created_s)
    return Completion(body=body, usage=usage)


class ChatTranslator(Protocol):
    """One upstream event -> the chat chunks it stands for."""

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]: ...


class UpstreamEvents(Protocol):
    """The upstream's own events, decoded (an SSE source, an AWS event-stream source)."""

    async def next_event(self) -> dict[str, Any] | None: ...

    def next_nowait(self) -> dict[str, Any] | None: ...


class ChatEventSource:
    """Upstream events as chat chunks: an EventSource for :class:`TranslatedStream`.

    A translation failure (an event of the wrong shape) is the upstream's protocol error,
    and an error event the translator raises for is that error: both are raised by
    ``next_event`` (after the chunks before them); ``next_nowait`` never raises.
    """

    def __init__(self, events: UpstreamEvents, to_chat: ChatTranslator) -> None:
        self._events = events
        self._to_chat = to_chat
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._error: ProviderError | None = None

    def _convert(self, event: Mapping[str, Any]) -> bool:
        try:
            self._pending.extend(self._to_chat.feed(event))
        except ProviderError as exc:  # an in-stream error event: raised by next_event
            self._error = exc
            return False
        except SHAPE_ERRORS as exc:
            self._error = ProviderProtocolError(
                f"upstream stream event has an unexpected shape: {exc!r}")
            self._error.__cause__ = exc
            return False
        return True

    async def next_event(self) -> dict[str, Any] | None:
        if self._pending:
            await trio.lowlevel.checkpoint()
        while not self._pending:
            if self._error is not None:
                raise self._error
            event = await self._events.next_event()
            if event is None:
                return None
            self._convert(event)
        return self._pending.popleft()

    def next_nowait(self) -> dict[str, Any] | None:
        while not self._pending:
            if self._error is not None:
                return None
            event = self._events.next_nowait()
            if event is None or not self._convert(event):
                return None
        return self._pending.popleft()


class OwnChunks:
    """Chat chunks to a chat client as they are: the source made them, none is shared,
    so none is copied (as :class:`~triogate.providers.translate.ChatPassthrough` must);
    a usage chunk at the end only if the upstream reported none."""

    def __init__(self, *, created_s: int, model: Any) -> None:
        self._created_s = created_s
        self._model = model
        self._id: Any = None
        self._usage_seen = False

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        if "usage" in event:
            self._usage_seen = True
        self._id = event.get("id")
        return [event]  # type: ignore[list-item]  # the source's own dict

    def finish(self, usage: Usage) -> list[dict[str, Any]]:
        if self._usage_seen:
            return []
        return [{"id": self._id or "chatcmpl-unknown", "object": "chat.completion.chunk",
                 "created": self._created_s, "model": self._model, "choices": [],
                 "usage": usage.to_chat()}]


def chat_stream(
    api: Api, source: ChatEventSource, *, request: Mapping[str, Any], created_s: int
) -> TranslatedStream:
    """The client's stream over chat chunks (usage from the upstream's usage chunk)."""
    input_tokens = estimate_input_tokens(api, request)
    translator: StreamTranslator
    if api == "chat":
        translator = OwnChunks(created_s=created_s, model=request.get("model"))
    else:
        translator = _HUB.translator(api, request=request, input_tokens=input_tokens,
                                     created_s=created_s)
    return TranslatedStream(source, ChatUsageTracker(input_tokens=input_tokens), translator)
