"""OpenAI chat completions <-> Amazon Bedrock's Converse API, and InvokeModel embeddings.

As for Gemini (:mod:`.translate_gemini`), the Bedrock provider speaks chat to the rest of
the gateway: a chat request becomes a Converse request here, a Converse answer a chat
completion, and each ConverseStream event (decoded from AWS's event stream by
:mod:`.bedrock_eventstream`) chat chunks. Pure functions and one small stream state.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

import orjson

from triogate.errors import ProviderProtocolError, ProviderStatusError, TranslationError
from triogate.providers.chat_chunks import ChatChunks
from triogate.providers.records import Usage
from triogate.providers.translate_chat_messages import (
    _append_turn,
    _arguments_object,
    _content_pieces,
    _text_of,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

STOP_TO_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}
_IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg",
                  "image/gif": "gif", "image/webp": "webp"}
#: ConverseStream's in-stream exceptions and the HTTP status each one stands for.
EXCEPTION_STATUS = {
    "throttlingException": 429,
    "validationException": 400,
    "accessDeniedException": 403,
    "modelTimeoutException": 408,
    "internalServerException": 500,
    "modelStreamErrorException": 502,
    "serviceUnavailableException": 503,
}


# --------------------------------------------------------------------------- requests


def _block(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"text": part.get("text", "")}
    if kind == "image_url":
        url = str((part.get("image_url") or {}).get("url", ""))
        if not url.startswith("data:"):
            raise TranslationError("Bedrock models take images as base64 data URLs only")
        header, _, data = url.partition(",")
        mime = header.removeprefix("data:").split(";")[0].lower()
        if ";base64" not in header or mime not in _IMAGE_FORMATS:
            raise TranslationError(
                "images for Bedrock models must be base64 png, jpeg, gif or webp")
        try:
            base64.b64decode(data, validate=True)
        except binascii.Error:
            raise TranslationError("image data is not valid base64") from None
        return {"image": {"format": _IMAGE_FORMATS[mime], "source": {"bytes": data}}}
    raise TranslationError(f"content part of type {kind!r} cannot be sent to a Bedrock model")


def _blocks(content: Any) -> list[dict[str, Any]]:
    return _content_pieces(content, _block)


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice in (None, "auto"):
        return {"auto": {}} if choice == "auto" else None
    if choice == "required":
        return {"any": {}}
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"tool": {"name": (choice.get("function") or {}).get("name", "")}}
    raise TranslationError(f"tool_choice {choice!r} is not supported by Bedrock models")


def chat_to_converse_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI chat request as a Converse request (the model id goes in the URL).

    Raises:
        TranslationError: what Converse cannot express (``n`` > 1, image URLs, ...).
    """
    if (body.get("n") or 1) != 1:
        raise TranslationError("n > 1 is not supported by Bedrock models")
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in body.get("messages") or ():
        role = message.get("role")
        if role in ("system", "developer"):
            system.append({"text": _text_of(message.get("content"))})
        elif role == "user":
            _append_turn(turns, "user", _blocks(message.get("content")))
        elif role == "assistant":
            blocks = _blocks(message.get("content"))
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                blocks.append({"toolUse": {
                    "toolUseId": call.get("id", ""), "name": function.get("name", ""),
                    "input": _arguments_object(function.get("arguments"))}})
            _append_turn(turns, "assistant", blocks)
        elif role == "tool":
            _append_turn(turns, "user", [{"toolResult": {
                "toolUseId": message.get("tool_call_id", ""),
                "content": [{"text": _text_of(message.get("content"))}]}}])
        elif role == "function":
            raise TranslationError("function messages are not supported; use tool messages")
        else:
            raise TranslationError(f"message role {role!r} is not supported")
    out: dict[str, Any] = {"messages": turns}
    if system:
        out["system"] = system
    config: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens:
        config["maxTokens"] = max_tokens
    if body.get("temperature") is not None:
        config["temperature"] = body["temperature"]
    if body.get("top_p") is not None:
        config["topP"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    if config:
        out["inferenceConfig"] = config
    tools = [{"toolSpec": {
        "name": (f := tool.get("function") or {}).get("name", ""),
        **({"description": f["description"]} if f.get("description") else {}),
        "inputSchema": {"json": f.get("parameters") or {"type": "object", "properties": {}}},
    }} for tool in body.get("tools") or ()]
    if tools and body.get("tool_choice") != "none":
        out["toolConfig"] = {"tools": tools}
        if (choice := _tool_choice(body.get("tool_choice"))) is not None:
            out["toolConfig"]["toolChoice"] = choice
    return out


# --------------------------------------------------------------------------- answers


def converse_usage(usage: Any) -> Usage | None:
    """Converse's ``usage`` (cache reads and writes count as input); None when absent."""
    if not isinstance(usage, dict):
        return None
    inputs, outputs = usage.get("inputTokens"), usage.get("outputTokens")
    if not isinstance(inputs, int) or not isinstance(outputs, int):
        return None
    cached = sum(v for k in ("cacheReadInputTokens", "cacheWriteInputTokens")
                 if isinstance(v := usage.get(k), int))
    return Usage(input_tokens=inputs + cached, output_tokens=outputs)


def converse_to_chat_response(
    response: Mapping[str, Any], *, model: str, usage: Usage, created_s: int, ident: str
) -> dict[str, Any]:
    """A Converse answer as an OpenAI chat completion."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in response["output"]["message"]["content"]:
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif "toolUse" in block:
            use = block["toolUse"]
            calls.append({"id": use.get("toolUseId", ""), "type": "function", "function": {
                "name": use.get("name", ""),
                "arguments": orjson.dumps(use.get("input") or {}).decode()}})
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    finish = STOP_TO_FINISH.get(str(response.get("stopReason")), "stop")
    return {"id": f"chatcmpl-{ident}", "object": "chat.completion", "created": created_s,
            "model": model, "choices": [{"index": 0, "message": message,
                                         "finish_reason": finish, "logprobs": None}],
            "usage": usage.to_chat()}


class ConverseToChat(ChatChunks):
    """ConverseStream events (``{event type: payload}``) -> OpenAI chat chunks."""

    def __init__(self, *, created_s: int, model: str, ident: str) -> None:
        super().__init__(created_s=created_s, model=model, chunk_id=f"chatcmpl-{ident}")
        self._tool_of_block: dict[int, int] = {}

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One event's chunks.

        Raises:
            ProviderStatusError: an in-stream exception (throttling, validation, ...).
        """
        block = event.get("contentBlockDelta")  # most events: first
        if block is not None:
            delta = block.get("delta") or {}
            if isinstance(delta.get("text"), str):
                return [self._delta({"content": delta["text"]})]
            if "toolUse" in delta:
                position = self._tool_of_block.get(block.get("contentBlockIndex", 0), 0)
                return [self._delta({"tool_calls": [{"index": position, "function": {
                    "arguments": delta["toolUse"].get("input", "")}}]})]
            return []
        if "exception" in event:
            kind = str(event["exception"])
            status = EXCEPTION_STATUS.get(kind, 500)
            body = orjson.dumps({"message": event.get("message", kind), "__type": kind})
            raise ProviderStatusError(status, body)
        if "messageStart" in event:
            return [self._delta({"role": "assistant", "content": ""})]
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = (start.get("start") or {}).get("toolUse")
            if use is None:
                return []
            position = len(self._tool_of_block)
            self._tool_of_block[start.get("contentBlockIndex", 0)] = position
            return [self._delta({"tool_calls": [{
                "index": position, "id": use.get("toolUseId", ""), "type": "function",
                "function": {"name": use.get("name", ""), "arguments": ""}}]})]
        if "messageStop" in event:
            reason = str(event["messageStop"].get("stopReason"))
            return [self._delta({}, STOP_TO_FINISH.get(reason, "stop"))]
        if "metadata" in event:
            usage = converse_usage(event["metadata"].get("usage"))
            return [self._chunk([], usage=usage.to_chat())] if usage is not None else []
        return []


# --------------------------------------------------------------------------- embeddings


def embedding_family(model_id: str) -> str:
    """``titan`` or ``cohere``: the InvokeModel body the model takes.

    Raises:
        TranslationError: a model of another family.
    """
    bare = model_id.rsplit("/", 1)[-1]
    bare = bare.split(".", 1)[1] if bare.split(".", 1)[0] in ("us", "eu", "apac") else bare
    if bare.startswith("amazon.titan-embed"):
        return "titan"
    if bare.startswith("cohere.embed"):
        return "cohere"
    raise TranslationError(f"{model_id!r} is not a Titan or Cohere embedding model")


def titan_body(text: str, dimensions: Any) -> dict[str, Any]:
    return {"inputText": text, **({"dimensions": dimensions} if dimensions else {})}


def cohere_body(texts: list[str]) -> dict[str, Any]:
    return {"texts": texts, "input_type": "search_document"}


def cohere_vectors(response: Mapping[str, Any]) -> list[list[float]]:
    embeddings = response.get("embeddings")
    if isinstance(embeddings, dict):  # embedding_types asked: {"float": [...]}
        embeddings = embeddings.get("float")
    if not isinstance(embeddings, list):
        raise ProviderProtocolError("Cohere embeddings reply has no embeddings list")
    return [list(v) for v in embeddings]
