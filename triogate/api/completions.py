"""POST /v1/completions: OpenAI's legacy text completions, served through chat.

The prompt becomes one user message; the answer and every stream chunk are turned back
into ``text_completion`` objects, usage included. Every upstream (OpenAI-compatible,
Anthropic, mock) is reached through chat completions: one code path for governance,
routing, the cache and accounting. What chat cannot express (``echo``, ``suffix``,
``best_of`` > 1, ``logprobs``, token-id prompts, several prompts) is a 400 naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from triogate.api import chat
from triogate.api.errors import ApiError
from triogate.api.flow import SettledAfter
from triogate.api.http import Response, StreamResponse
from triogate.api.rebody import rebodied

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.http import Request
    from triogate.api.services import Services

#: OpenAI's default ``max_tokens`` for legacy completions.
DEFAULT_MAX_TOKENS = 16
_PASSED = ("model", "max_tokens", "temperature", "top_p", "n", "stop", "presence_penalty",
           "frequency_penalty", "seed", "user", "stream", "stream_options", "logit_bias",
           "metadata", "cache", "mock_response", "fallbacks", "num_retries", "timeout",
           "drop_params")


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise ApiError(400, "'prompt' must be one string here (token ids and several "
                       "prompts are not supported)", param="prompt")
    if not isinstance(prompt, str):
        raise ApiError(400, "field 'prompt' must be a string", param="prompt")
    return prompt


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A completions request as a chat request (400 for what chat cannot express)."""
    prompt = _prompt(body)
    refused = {"echo": bool(body.get("echo")), "suffix": body.get("suffix") not in (None, ""),
               "best_of": body.get("best_of") not in (None, 1),
               "logprobs": body.get("logprobs") is not None}
    for name, bad in refused.items():
        if bad:
            raise ApiError(400, f"'{name}' is not supported by this gateway", param=name)
    out = {k: body[k] for k in _PASSED if k in body}
    out["messages"] = [{"role": "user", "content": prompt}]
    out.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    return out


def _choice(choice: dict[str, Any], *, delta: bool) -> dict[str, Any]:
    message = choice.get("delta" if delta else "message") or {}
    return {"text": message.get("content") or "", "index": choice.get("index", 0),
            "logprobs": None, "finish_reason": choice.get("finish_reason")}


def from_chat(value: dict[str, Any], *, delta: bool = False) -> dict[str, Any]:
    """A chat completion (or chunk) as a ``text_completion``."""
    out: dict[str, Any] = {
        "id": str(value.get("id", "")).replace("chatcmpl-", "cmpl-", 1),
        "object": "text_completion",
        "created": value.get("created", 0),
        "model": value.get("model", ""),
        "choices": [_choice(c, delta=delta) for c in value.get("choices") or ()],
    }
    if value.get("usage") is not None:
        out["usage"] = value["usage"]
    if value.get("system_fingerprint") is not None:
        out["system_fingerprint"] = value["system_fingerprint"]
    return out


def _rewrite_event(chunk: bytes) -> bytes:
    """One chat SSE event as a completions event (errors and ``[DONE]`` unchanged)."""
    if not chunk.startswith(b"data: {"):
        return chunk
    event = orjson.loads(chunk[len(b"data: "):])
    if "error" in event:
        return chunk
    return b"data: " + orjson.dumps(from_chat(event, delta=True)) + b"\n\n"


async def completions(services: Services, request: Request) -> Response:
    """Validate and translate, then serve as a chat completion."""
    response = await chat.chat_completions(services, rebodied(request, to_chat))
    if isinstance(response, StreamResponse):
        produce = response.produce

        async def translated(write: Callable[[bytes], Awaitable[None]]) -> None:
            async def rewrite(chunk: bytes) -> None:
                # One write may carry several events (a burst from one upstream read);
                # chat events are "data: <json>\n\n" and JSON has no raw newlines.
                await write(b"".join(_rewrite_event(event + b"\n\n")
                                     for event in chunk.split(b"\n\n") if event))
            await produce(rewrite)

        response.produce = translated
        return response
    if response.status == 200:
        try:
            response.body = orjson.dumps(from_chat(orjson.loads(response.body)))
        except (AttributeError, TypeError, ValueError) as exc:  # not a chat completion
            error = ApiError(502, "the upstream model sent a reply that could not be read",
                             "api_error")
            if isinstance(response, SettledAfter):
                raise response.refuse(exc, error) from None
            raise error from None
    return response
