"""A deterministic provider with no network, for tests, demos and benchmarks.

The reply is derived from the prompt ("Mock reply from <model> to: <first words of the
last user message>"), or is ``mock.response``, or the request's ``mock_response`` field
(LiteLLM's convention). ``mock.output_tokens`` makes the reply exactly that many tokens
long (by triogate's own estimate, so counted and reported usage agree).

Time is trio's clock: a call takes ``mock.latency_s``; a stream sends its first text after
``mock.first_token_s`` (default a quarter of the latency) and the rest spread evenly up to
``latency_s``, so MockClock tests can assert exact times. Failures are drawn from a
``random.Random(seed)`` per provider: the same seed, the same failures.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import math
import random
import struct
import time
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from triogate.config import MockSettings
from triogate.errors import ProviderStatusError
from triogate.providers.mock_schema import instance
from triogate.providers.records import Completion, Usage
from triogate.providers.streaming import TranslatedStream, check_streamable
from triogate.providers.tokens import (
    CHARS_PER_TOKEN,
    count_output_tokens,
    estimate_input_tokens,
)
from triogate.providers.translate import ChatHub

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping
    from contextlib import AbstractAsyncContextManager

    from triogate.config import Deployment
    from triogate.providers.records import Api, ProviderStream

#: Words of the user's message quoted in the derived reply.
QUOTED_WORDS = 8
#: Text chunks a streamed reply is cut into (at most).
STREAM_CHUNKS = 8
#: Floats per embedding unless the request asks for ``dimensions``.
EMBEDDING_DIMENSIONS = 16
_FILLER = " lorem ipsum dolor sit amet"


@attrs.frozen(kw_only=True)
class MockReply:
    """What the mock will answer to one request."""

    text: str
    finish_reason: str
    usage: Usage
    #: (id, function name, arguments JSON) when the reply is a tool call.
    tool_call: tuple[str, str, str] | None = None


def _last_user_text(chat_request: Mapping[str, Any]) -> str:
    for message in reversed(chat_request.get("messages") or ()):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return " ".join(p.get("text", "") for p in content or () if p.get("type") == "text")
    return ""


def _fit(text: str, tokens: int) -> str:
    """``text`` padded or cut to exactly ``tokens`` tokens of the estimate (4 chars each)."""
    chars = tokens * CHARS_PER_TOKEN
    while len(text) < chars:
        text += _FILLER
    return text[:chars]


def _tool_to_call(chat_request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The function tool the reply calls: the one ``tool_choice`` names, else the first
    when a call is required, or allowed (``auto``) and the last message is not a tool's
    result (so that an agent's loop ends with a text answer)."""
    functions = [t.get("function") for t in chat_request.get("tools") or ()
                 if isinstance(t, dict) and t.get("type") == "function"]
    tools: list[dict[str, Any]] = [f for f in functions if isinstance(f, dict) and f.get("name")]
    choice = chat_request.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name")
        return next((t for t in tools if t["name"] == named), tools[0])
    messages = chat_request.get("messages") or ()
    last = messages[-1] if messages else {}
    if choice != "required" and isinstance(last, dict) and last.get("role") == "tool":
        return None
    return tools[0]


def _structured(chat_request: Mapping[str, Any], text: str) -> tuple[str | None, str] | None:
    """(None, JSON) for a ``response_format``, (tool name, arguments JSON) for a call."""
    tool = _tool_to_call(chat_request)
    if tool is not None:
        arguments = orjson.dumps(instance(tool.get("parameters") or {"type": "object"}))
        return str(tool["name"]), arguments.decode()
    fmt = chat_request.get("response_format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
        return None, orjson.dumps(instance(schema)).decode()
    if fmt.get("type") == "json_object":
        return None, orjson.dumps({"answer": text}).decode()
    return None


def plan_reply(
    api: Api, body: Mapping[str, Any], chat_request: Mapping[str, Any], deployment: Deployment
) -> MockReply:
    """The reply, finish reason and usage for a chat-like request (pure).

    The request's ``mock_response`` wins; else a tool call or ``response_format``'s JSON
    (:mod:`.mock_schema`), never cut short; else ``mock.response`` or the derived text.
    """
    settings = deployment.mock or MockSettings()
    text = body.get("mock_response")
    structured = None if isinstance(text, str) else _structured(
        chat_request, _derived_text(chat_request, deployment))
    if structured is not None:
        name, value = structured
        usage = Usage(input_tokens=estimate_input_tokens(api, body),
                      output_tokens=count_output_tokens(value))
        if name is None:
            return MockReply(text=value, finish_reason="stop", usage=usage)
        arguments = value
        call_id = "call_" + hashlib.sha256(f"{name}\0{arguments}".encode()).hexdigest()[:24]
        return MockReply(text="", finish_reason="tool_calls", usage=usage,
                         tool_call=(call_id, name, arguments))
    if not isinstance(text, str):
        text = settings.response
    if not isinstance(text, str):
        text = _derived_text(chat_request, deployment)
    if settings.output_tokens is not None:
        text = _fit(text, settings.output_tokens)
    finish_reason = "stop"
    max_tokens = chat_request.get("max_completion_tokens") or chat_request.get("max_tokens")
    if isinstance(max_tokens, int) and count_output_tokens(text) > max_tokens:
        text, finish_reason = text[: max_tokens * CHARS_PER_TOKEN], "length"
    usage = Usage(
        input_tokens=estimate_input_tokens(api, body), output_tokens=count_output_tokens(text)
    )
    return MockReply(text=text, finish_reason=finish_reason, usage=usage)


def _derived_text(chat_request: Mapping[str, Any], deployment: Deployment) -> str:
    words = _last_user_text(chat_request).split()
    quoted = " ".join(words[:QUOTED_WORDS])
    return f"Mock reply from {deployment.upstream_model} to: {quoted}".rstrip(": ")


def stream_offsets_s(settings: MockSettings, pieces: int) -> tuple[list[float], float]:
    """When each of ``pieces`` text chunks is sent, and when the stream ends.

    Seconds after the call began: the first chunk at ``first_token_s`` (default
    ``latency_s / 4``), the end exactly at ``latency_s`` (or at the first chunk, when that
    comes later), the other chunks evenly spread so that the last one is at the end.
    """
    first = settings.first_token_s if settings.first_token_s is not None else settings.latency_s / 4
    end = max(first, settings.latency_s)
    if pieces <= 1:
        return [first], end
    step = (end - first) / (pieces - 1)
    return [first + i * step for i in range(pieces - 1)] + [end], end


def split_text(text: str, pieces: int = STREAM_CHUNKS) -> list[str]:
    """``text`` in up to ``pieces`` consecutive parts of near-equal length."""
    count = max(1, min(pieces, len(text)))
    bounds = [round(i * len(text) / count) for i in range(count + 1)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def embedding_vector(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """A deterministic unit vector derived from a hash of ``text``."""
    digest = hashlib.shake_256(text.encode()).digest(2 * dimensions)
    raw = [
        int.from_bytes(digest[i : i + 2], "big") / 32767.5 - 1.0 for i in range(0, len(digest), 2)
    ]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def _embedding_inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [orjson.dumps(value).decode()]
    if isinstance(value, list) and value:
        return [v if isinstance(v, str) else orjson.dumps(v).decode() for v in value]
    raise ValueError("input must be a non-empty string, list of strings, or token list")


class _TimedChunks:
    """An EventSource that hands out chat chunks at fixed offsets from ``start``."""

    def __init__(self, timed: list[tuple[float, dict[str, Any]]], *, start: float) -> None:
        self._timed = timed
        self._start = start
        self._next = 0

    async def next_event(self) -> dict[str, Any] | None:
        if self._next >= len(self._timed):
            await trio.lowlevel.checkpoint()
            return None
        offset_s, chunk = self._timed[self._next]
        self._next += 1
        await trio.sleep_until(self._start + offset_s)
        return chunk

    def next_nowait(self) -> dict[str, Any] | None:
        return None  # every chunk has its own time


def _calls(reply: MockReply) -> list[dict[str, Any]]:
    if reply.tool_call is None:
        return []
    call_id, name, arguments = reply.tool_call
    return [{"id": call_id, "type": "function",
             "function": {"name": name, "arguments": arguments}}]


def _message(reply: MockReply) -> dict[str, Any]:
    if reply.tool_call is None:
        return {"role": "assistant", "content": reply.text}
    return {"role": "assistant", "content": None, "tool_calls": _calls(reply)}


class MockProvider:
    """The ``mock/`` provider: every API, deterministic replies, configurable timing.

    Args:
        seed: seeds the failure draws (``mock.failure_rate``).
        clock: wall-clock seconds for ``created`` fields.
    """

    def __init__(self, *, seed: int = 0, clock: Callable[[], float] = time.time) -> None:
        self._random = random.Random(seed)
        self._ids = itertools.count(1)
        self._clock = clock
        self._hub = ChatHub()

    def _maybe_fail(self, settings: MockSettings) -> None:
        # Draw on every call, so the sequence does not depend on which calls can fail.
        if self._random.random() < settings.failure_rate:
            message = f"mock failure (failure_rate={settings.failure_rate})"
            body = {
                "error": {"message": message, "type": "mock_error", "code": settings.failure_status}
            }
            raise ProviderStatusError(settings.failure_status, orjson.dumps(body), message=message)

    def _chat_response(self, model: str, reply: MockReply) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-mock{next(self._ids)}",
            "object": "chat.completion",
            "created": int(self._clock()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": _message(reply),
                    "finish_reason": reply.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": reply.usage.to_chat(),
        }

    async def complete(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> Completion:
        """Answer after ``latency_s`` (a checkpoint); may raise ProviderStatusError."""
        settings = deployment.mock or MockSettings()
        if api == "embeddings":
            out = self._embed(body, deployment)
            self._maybe_fail(settings)
            await trio.sleep(settings.latency_s)
            return out
        chat_request = self._hub.request(api, body, stream=False)
        reply = plan_reply(api, body, chat_request, deployment)
        self._maybe_fail(settings)
        await trio.sleep(settings.latency_s)
        response = self._chat_response(deployment.upstream_model, reply)
        out_body = self._hub.response(
            api, response, request=body, usage=reply.usage, created_s=response["created"]
        )
        return Completion(body=out_body, usage=reply.usage)

    def stream(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> AbstractAsyncContextManager[ProviderStream]:
        """Stream the reply in timed chunks. Raises ValueError at once for embeddings."""
        check_streamable(api)
        return self._open_stream(api, body, deployment)

    @contextlib.asynccontextmanager
    async def _open_stream(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> AsyncIterator[TranslatedStream]:
        settings = deployment.mock or MockSettings()
        chat_request = self._hub.request(api, body, stream=True)
        reply = plan_reply(api, body, chat_request, deployment)
        self._maybe_fail(settings)
        await trio.lowlevel.checkpoint()
        start = trio.current_time()
        created_s = int(self._clock())
        base = {
            "id": f"chatcmpl-mock{next(self._ids)}",
            "object": "chat.completion.chunk",
            "created": created_s,
            "model": deployment.upstream_model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return {**base, "choices": [choice]}

        pieces = split_text(reply.text) if reply.text else []
        calls = _calls(reply)
        arg_pieces = split_text(calls[0]["function"]["arguments"]) if calls else []
        offsets, end = stream_offsets_s(settings, len(pieces) or len(arg_pieces))
        timed = [(offsets[0], chunk({"role": "assistant", "content": ""}))]
        timed += [(t, chunk({"content": p})) for t, p in zip(offsets, pieces, strict=False)]
        for call in calls:
            head = {"index": 0, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}
            timed.append((offsets[0], chunk({"tool_calls": [head]})))
            timed += [(t, chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}))
                      for t, p in zip(offsets, arg_pieces, strict=False)]
        timed.append((end, chunk({}, reply.finish_reason)))
        timed.append((end, {**base, "choices": [], "usage": reply.usage.to_chat()}))
        input_tokens = estimate_input_tokens(api, body)
        yield TranslatedStream(
            _TimedChunks(timed, start=start),
            self._hub.tracker(input_tokens=input_tokens),
            self._hub.translator(api, request=body, input_tokens=input_tokens, created_s=created_s),
        )

    def _embed(self, body: Mapping[str, Any], deployment: Deployment) -> Completion:
        inputs = _embedding_inputs(body.get("input"))
        dimensions = body.get("dimensions") or EMBEDDING_DIMENSIONS
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(inputs):
            vector = embedding_vector(f"{deployment.upstream_model}\0{text}", dimensions)
            embedding: Any = vector
            if as_base64:
                embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        tokens = estimate_input_tokens("embeddings", body)
        usage = Usage(input_tokens=tokens, output_tokens=0)
        out = {
            "object": "list",
            "data": data,
            "model": deployment.upstream_model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return Completion(body=out, usage=usage)
