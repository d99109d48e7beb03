"""OpenAI chat completions <-> Google's generateContent (Gemini API and Vertex AI).

The Gemini provider speaks chat to the rest of the gateway: a request is first made a chat
request (:mod:`.translate`), then a ``GenerateContentRequest`` here; the answer, or each
streamed ``GenerateContentResponse``, becomes a chat completion, or chat chunks, here. The
chat hub takes it from there to the client's API. Pure functions and one small stream
state; nothing here does I/O.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import TYPE_CHECKING, Any

import orjson

from triogate.errors import ProviderStatusError, TranslationError
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

FINISH_TO_CHAT = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
_TOOL_CHOICE = {"auto": "AUTO", "none": "NONE", "required": "ANY"}


# --------------------------------------------------------------------------- requests


def _part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"text": part.get("text", "")}
    if kind == "image_url":
        url = str((part.get("image_url") or {}).get("url", ""))
        if url.startswith("data:"):
            header, _, data = url.partition(",")
            if ";base64" not in header:
                raise TranslationError("image data URLs must be base64-encoded")
            return {"inlineData": {"mimeType": header.removeprefix("data:").split(";")[0],
                                   "data": data}}
        mime = "image/png" if url.lower().endswith(".png") else "image/jpeg"
        return {"fileData": {"mimeType": mime, "fileUri": url}}
    raise TranslationError(f"content part of type {kind!r} cannot be sent to a Gemini model")


def _parts(content: Any) -> list[dict[str, Any]]:
    return _content_pieces(content, _part)


def _tool_response(content: Any) -> dict[str, Any]:
    text = _text_of(content)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {"content": text}
    return value if isinstance(value, dict) else {"content": value}


def _tool_config(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str) and choice in _TOOL_CHOICE:
        return {"functionCallingConfig": {"mode": _TOOL_CHOICE[choice]}}
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name", "")
        return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
    raise TranslationError(f"tool_choice {choice!r} is not supported")


def _generation_config(body: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "topP"), ("seed", "seed"),
                         ("presence_penalty", "presencePenalty"),
                         ("frequency_penalty", "frequencyPenalty")):
        if body.get(ours) is not None:
            config[theirs] = body[ours]
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens:
        config["maxOutputTokens"] = max_tokens
    stop = body.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    form = body.get("response_format") or {}
    if form.get("type") in ("json_object", "json_schema"):
        config["responseMimeType"] = "application/json"
        schema = (form.get("json_schema") or {}).get("schema")
        if form.get("type") == "json_schema" and schema:
            config["responseJsonSchema"] = schema
    return config


def chat_to_gemini_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI chat request as a ``GenerateContentRequest`` (the model goes in the URL).

    Raises:
        TranslationError: what generateContent cannot express (``n`` > 1, audio, ...).
    """
    if (body.get("n") or 1) != 1:
        raise TranslationError("n > 1 is not supported by Gemini models through the gateway")
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool-call id -> function name (Gemini answers by name)
    for message in body.get("messages") or ():
        role = message.get("role")
        if role in ("system", "developer"):
            system.append({"text": _text_of(message.get("content"))})
        elif role == "user":
            _append_turn(turns, "user", _parts(message.get("content")), "parts")
        elif role == "assistant":
            parts = _parts(message.get("content"))
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                names[str(call.get("id", ""))] = str(function.get("name", ""))
                part: dict[str, Any] = {"functionCall": {
                    "name": function.get("name", ""),
                    "args": _arguments_object(function.get("arguments"))}}
                _, mark, signature = str(call.get("id", "")).partition(SIGNATURE_MARK)
                if mark and signature:
                    part["thoughtSignature"] = signature
                parts.append(part)
            _append_turn(turns, "model", parts, "parts")
        elif role == "tool":
            call_id = str(message.get("tool_call_id", ""))
            _append_turn(turns, "user", [{"functionResponse": {
                "name": names.get(call_id, call_id),
                "response": _tool_response(message.get("content"))}}], "parts")
        else:
            raise TranslationError(f"message role {role!r} is not supported")
    out: dict[str, Any] = {"contents": turns}
    if system:
        out["systemInstruction"] = {"parts": system}
    if body.get("tools"):
        declarations = []
        for tool in body["tools"]:
            function = tool.get("function") or {}
            declaration: dict[str, Any] = {"name": function.get("name", "")}
            if function.get("description"):
                declaration["description"] = function["description"]
            if function.get("parameters"):
                declaration["parametersJsonSchema"] = function["parameters"]
            declarations.append(declaration)
        out["tools"] = [{"functionDeclarations": declarations}]
        if (config := _tool_config(body.get("tool_choice"))) is not None:
            out["toolConfig"] = config
    if generation := _generation_config(body):
        out["generationConfig"] = generation
    return out


# --------------------------------------------------------------------------- answers


def gemini_usage(metadata: Any) -> Usage | None:
    """``usageMetadata`` as Usage (thinking tokens are output); None when absent."""
    if not isinstance(metadata, dict) or not isinstance(metadata.get("promptTokenCount"), int):
        return None
    output = sum(v for k in ("candidatesTokenCount", "thoughtsTokenCount")
                 if isinstance(v := metadata.get(k), int))
    return Usage(input_tokens=metadata["promptTokenCount"], output_tokens=output)


def call_id(name: str, args: Any, position: int) -> str:
    """A tool-call id for a functionCall without one (Gemini's usually have none)."""
    digest = hashlib.sha256(orjson.dumps([name, args, position])).hexdigest()[:24]
    return f"call_{digest}"


def _candidate_parts(response: Mapping[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    candidates = response.get("candidates") or [{}]
    candidate = candidates[0]
    return candidate.get("finishReason"), (candidate.get("content") or {}).get("parts") or []


#: Joins a tool call's id and the thought signature Gemini gave its functionCall part:
#: the client sends the id back with the call's result, and the signature goes back to
#: Gemini with the call (thinking models refuse a replayed call without it).
SIGNATURE_MARK = "__thought__"


def _call(part: Mapping[str, Any], position: int) -> dict[str, Any]:
    fc = part["functionCall"]
    args = fc.get("args") or {}
    ident = fc.get("id") or call_id(fc.get("name", ""), args, position)
    if part.get("thoughtSignature"):
        ident = f"{ident}{SIGNATURE_MARK}{part['thoughtSignature']}"
    return {"id": ident,
            "type": "function",
            "function": {"name": fc.get("name", ""), "arguments": orjson.dumps(args).decode()}}


def _finish(reason: Any, calls: bool, blocked: bool) -> str:
    if blocked:
        return "content_filter"
    if calls and reason in (None, "STOP"):
        return "tool_calls"
    return FINISH_TO_CHAT.get(str(reason), "stop")


def gemini_output_text(response: Mapping[str, Any]) -> str:
    """The generated text and function calls, for counting when usage is missing."""
    pieces: list[str] = []
    for part in _candidate_parts(response)[1]:
        if isinstance(part.get("text"), str):
            pieces.append(part["text"])
        if "functionCall" in part:
            pieces.append(orjson.dumps(part["functionCall"]).decode())
    return "".join(pieces)


def gemini_to_chat_response(
    response: Mapping[str, Any], *, usage: Usage, created_s: int
) -> dict[str, Any]:
    """A ``GenerateContentResponse`` as an OpenAI chat completion."""
    reason, parts = _candidate_parts(response)
    texts = [p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought")]
    calls = [_call(p, i) for i, p in enumerate(parts) if "functionCall" in p]
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    blocked = not response.get("candidates") and bool(
        (response.get("promptFeedback") or {}).get("blockReason"))
    return {
        "id": "chatcmpl-" + str(response.get("responseId") or "gemini"),
        "object": "chat.completion",
        "created": created_s,
        "model": response.get("modelVersion"),
        "choices": [{"index": 0, "message": message,
                     "finish_reason": _finish(reason, bool(calls), blocked), "logprobs": None}],
        "usage": usage.to_chat(),
    }


class GeminiToChat(ChatChunks):
    """Streamed ``GenerateContentResponse`` objects -> OpenAI chat chunks.

    Gemini sends whole function calls in one chunk and cumulative ``usageMetadata``; the
    chunk with a ``finishReason`` closes the choice and its usage follows as a usage chunk.
    """

    def __init__(self, *, created_s: int, model: str | None) -> None:
        super().__init__(created_s=created_s, model=model, chunk_id="chatcmpl-gemini")
        self._started = False
        self._calls = 0

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One upstream event's chunks.

        Raises:
            ProviderStatusError: an ``error`` object in the stream, with its ``code``.
        """
        if "error" in event and "candidates" not in event:
            error = event["error"] if isinstance(event["error"], dict) else {}
            code = error.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            raise ProviderStatusError(status, orjson.dumps(dict(event)))
        out: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            if event.get("responseId"):
                self._id = "chatcmpl-" + str(event["responseId"])
            self._model = event.get("modelVersion") or self._model
            out.append(self._delta({"role": "assistant", "content": ""}))
        reason, parts = _candidate_parts(event)
        for part in parts:
            if isinstance(part.get("text"), str) and not part.get("thought"):
                out.append(self._delta({"content": part["text"]}))
            elif "functionCall" in part:
                call = {"index": self._calls, **_call(part, self._calls)}
                self._calls += 1
                out.append(self._delta({"tool_calls": [call]}))
        blocked = not parts and not event.get("candidates") and bool(
            (event.get("promptFeedback") or {}).get("blockReason"))
        if reason is not None or blocked:  # usageMetadata is final with the finish
            out.append(self._delta({}, _finish(reason, self._calls > 0, blocked)))
            usage = gemini_usage(event.get("usageMetadata"))
            if usage is not None:
                out.append(self._chunk([], usage=usage.to_chat()))
        return out


# --------------------------------------------------------------------------- embeddings


def embedding_inputs(body: Mapping[str, Any]) -> list[str]:
    """The texts of an OpenAI embeddings request.

    Raises:
        TranslationError: token-id inputs (Gemini and Vertex take text only).
    """
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise TranslationError("input: this embedding model takes a string or a list of strings")


def embeddings_response(
    vectors: list[list[float]], *, model: str, usage: Usage, encoding: Any
) -> dict[str, Any]:
    """Vectors as an OpenAI embeddings answer (``encoding_format: base64`` honoured)."""
    data = []
    for index, vector in enumerate(vectors):
        value: Any = vector
        if encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": value})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": usage.input_tokens, "total_tokens": usage.input_tokens}}
