"""OpenAI chat completions <-> Anthropic messages: requests, responses and streams.

Pure functions and small stateful stream translators; no I/O. What cannot be expressed in
the other API (``n > 1``, audio or file parts, PDF documents) raises
:class:`~triogate.errors.TranslationError` with a message fit for the client: the API layer
answers it as a 400.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from triogate.errors import TranslationError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from triogate.providers.records import Usage

#: Anthropic requires max_tokens; OpenAI does not. Used when the client set none.
DEFAULT_MAX_TOKENS = 4096

STOP_TO_FINISH = {
    "end_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "refusal": "content_filter",
}
FINISH_TO_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def strip_id(value: Any, *prefixes: str) -> str:
    """An upstream id without its API's prefix, so ids map between APIs deterministically."""
    text = str(value or "unknown")
    for prefix in prefixes:
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def _copy(source: Mapping[str, Any], target: dict[str, Any], *names: str) -> None:
    for name in names:
        if source.get(name) is not None:
            target[name] = source[name]


def _text_of(content: Any) -> str:
    """The text of a chat/Anthropic content value: a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise TranslationError(
                f"content part of type {part.get('type')!r} is not supported here")
        parts.append(part.get("text", ""))
    return "".join(parts)


def _arguments_object(arguments: Any) -> dict[str, Any]:
    """Tool-call arguments (a JSON string in OpenAI) as the object Anthropic wants."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_raw_arguments": arguments}
    return value if isinstance(value, dict) else {"_value": value}


# --------------------------------------------------------------------------- requests


def _chat_part_to_block(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": part.get("text", "")}
    if kind == "image_url":
        url = (part.get("image_url") or {}).get("url", "")
        if url.startswith("data:"):
            header, _, data = url.partition(",")
            media_type = header.removeprefix("data:").split(";")[0]
            if ";base64" not in header:
                raise TranslationError("image data URLs must be base64-encoded")
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data},
            }
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise TranslationError(f"content part of type {kind!r} cannot be sent to an Anthropic model")


def _content_pieces(content: Any, piece: Callable[[Mapping[str, Any]], dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """A chat message's ``content`` (none, a string or a list of parts) as the pieces
    ``piece`` makes of each part; a non-empty string counts as one text part."""
    if content is None:
        return []
    if isinstance(content, str):
        return [piece({"type": "text", "text": content})] if content else []
    return [piece(part) for part in content]


def _chat_content_to_blocks(content: Any) -> list[dict[str, Any]]:
    return _content_pieces(content, _chat_part_to_block)


def _append_turn(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]],
                 key: str = "content") -> None:
    """Add blocks as a turn under ``key``; consecutive turns of one role merge (Anthropic,
    Converse and Gemini all want the roles to alternate)."""
    if not blocks:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1][key].extend(blocks)
    else:
        turns.append({"role": role, key: list(blocks)})


def _chat_tool_choice_to_messages(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None:
        result: dict[str, Any] | None = {"type": "auto"} if parallel is False else None
    elif choice == "auto":
        result = {"type": "auto"}
    elif choice == "none":
        result = {"type": "none"}
    elif choice == "required":
        result = {"type": "any"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        result = {"type": "tool", "name": (choice.get("function") or {}).get("name", "")}
    else:
        raise TranslationError(f"tool_choice {choice!r} is not supported")
    if result is not None and parallel is False and result["type"] != "none":
        result["disable_parallel_tool_use"] = True
    return result


def chat_to_messages_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI chat request as an Anthropic messages request.

    System and developer messages become ``system``; tool results become ``tool_result``
    blocks in a user turn; assistant ``tool_calls`` become ``tool_use`` blocks.

    Raises:
        TranslationError: something Anthropic cannot express (``n > 1``, audio, files, ...).
    """
    if (body.get("n") or 1) != 1:
        raise TranslationError("n > 1 is not supported by Anthropic models")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in body.get("messages") or ():
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text_of(message.get("content")))
        elif role == "user":
            _append_turn(turns, "user", _chat_content_to_blocks(message.get("content")))
        elif role == "assistant":
            blocks = _chat_content_to_blocks(message.get("content"))
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id", ""),
                        "name": function.get("name", ""),
                        "input": _arguments_object(function.get("arguments")),
                    }
                )
            _append_turn(turns, "assistant", blocks)
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id", ""),
                "content": _text_of(message.get("content")),
            }
            _append_turn(turns, "user", [result])
        else:
            raise TranslationError(f"message role {role!r} is not supported")
    for turn in turns:
        blocks = turn["content"]
        if len(blocks) == 1 and blocks[0]["type"] == "text":
            turn["content"] = blocks[0]["text"]
    out: dict[str, Any] = {"model": body.get("model"), "messages": turns}
    if len(system) == 1:
        out["system"] = system[0]
    elif system:
        out["system"] = [{"type": "text", "text": text} for text in system]
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    out["max_tokens"] = max_tokens or DEFAULT_MAX_TOKENS
    _copy(body, out, "temperature", "top_p", "stream")
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("tools"):
        out["tools"] = [
            {
                "name": (f := tool.get("function") or {}).get("name", ""),
                **({"description": f["description"]} if f.get("description") else {}),
                "input_schema": f.get("parameters") or {"type": "object", "properties": {}},
            }
            for tool in body["tools"]
        ]
    choice = _chat_tool_choice_to_messages(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None and body.get("tools"):
        out["tool_choice"] = choice
    if body.get("user"):
        out["metadata"] = {"user_id": body["user"]}
    return out


def _block_to_chat_part(block: Mapping[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block.get("text", "")}
    if kind == "image":
        source = block.get("source") or {}
        if source.get("type") == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data', '')}"
        elif source.get("type") == "url":
            url = source.get("url", "")
        else:
            raise TranslationError(f"image source {source.get('type')!r} is not supported")
        return {"type": "image_url", "image_url": {"url": url}}
    raise TranslationError(f"content block of type {kind!r} cannot be sent to an OpenAI model")


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Plain text stays a string (what every OpenAI-compatible server accepts)."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _messages_tool_choice_to_chat(choice: Mapping[str, Any]) -> tuple[Any, bool | None]:
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name", "")}}, parallel
    raise TranslationError(f"tool_choice {choice!r} is not supported")


def messages_to_chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic messages request as an OpenAI chat request.

    Raises:
        TranslationError: something OpenAI chat cannot express (documents, unknown blocks).
    """
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    elif isinstance(system, list):
        messages.extend({"role": "system", "content": _text_of([b])} for b in system)
    for turn in body.get("messages") or ():
        role, content = turn.get("role"), turn.get("content")
        if role not in ("user", "assistant"):
            raise TranslationError(f"message role {role!r} is not supported")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for block in content or ():
            kind = block.get("type")
            if kind == "tool_result":
                result = block.get("content")
                text = (
                    result
                    if isinstance(result, str)
                    else _text_of([b for b in result or () if b.get("type") == "text"])
                )
                messages.append(
                    {"role": "tool", "tool_call_id": block.get("tool_use_id", ""), "content": text}
                )
            elif kind == "tool_use":
                calls.append(
                    {
                        "id": block.get("id", ""),
                        "type": "function",
                        "function": {
                            "name": block.get("name", ""),
                            "arguments": orjson.dumps(block.get("input") or {}).decode(),
                        },
                    }
                )
            elif kind in ("thinking", "redacted_thinking"):
                continue  # the other API has no place for it
            else:
                parts.append(_block_to_chat_part(block))
        if role == "assistant":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": _text_of(parts) if parts else None,
            }
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
        elif parts:
            messages.append({"role": "user", "content": _chat_content(parts)})
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    _copy(body, out, "max_tokens", "temperature", "top_p", "stream")
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    if body.get("tools"):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.get("name", ""),
                    **({"description": tool["description"]} if tool.get("description") else {}),
                    "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
                },
            }
            for tool in body["tools"]
        ]
        if body.get("tool_choice"):
            choice, parallel = _messages_tool_choice_to_chat(body["tool_choice"])
            out["tool_choice"] = choice
            if parallel is not None:
                out["parallel_tool_calls"] = parallel
    user = (body.get("metadata") or {}).get("user_id")
    if user:
        out["user"] = user
    return out


# --------------------------------------------------------------------------- responses


def chat_to_messages_response(response: Mapping[str, Any], *, usage: Usage) -> dict[str, Any]:
    """An OpenAI chat completion as an Anthropic message (first choice only)."""
    choices = response.get("choices") or [{}]
    message = choices[0].get("message") or {}
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if text:
        content.append({"type": "text", "text": _text_of(text)})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": _arguments_object(function.get("arguments")),
            }
        )
    return {
        "id": "msg_" + strip_id(response.get("id"), "chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": response.get("model"),
        "content": content,
        "stop_reason": FINISH_TO_STOP.get(choices[0].get("finish_reason") or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": usage.to_messages(),
    }


def messages_to_chat_response(
    response: Mapping[str, Any], *, usage: Usage, created_s: int
) -> dict[str, Any]:
    """An Anthropic message as an OpenAI chat completion."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in response.get("content") or ():
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {
                        "name": block.get("name", ""),
                        "arguments": orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
    }
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + strip_id(response.get("id"), "msg_"),
        "object": "chat.completion",
        "created": created_s,
        "model": response.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": STOP_TO_FINISH.get(response.get("stop_reason") or "", "stop"),
                "logprobs": None,
            }
        ],
        "usage": usage.to_chat(),
    }


# --------------------------------------------------------------------------- streams


class ChatToMessagesStream:
    """OpenAI chat chunks -> Anthropic stream events (message_start ... message_stop).

    Args:
        input_tokens: prompt tokens for ``message_start`` (the upstream reports them
            only at the end; the final ``message_delta`` carries the real numbers).
        model: used when the upstream chunks name none.
    """

    def __init__(self, *, input_tokens: int, model: str | None = None) -> None:
        self._input_tokens = input_tokens
        self._model = model
        self._id = "msg_unknown"
        self._started = False
        self._next_index = 0
        self._open: int | None = None  # index of the open block
        self._open_text = False
        self._tool_blocks: dict[int, int] = {}  # chat tool-call index -> block index
        self._stop_reason = "end_turn"

    def _start(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        self._started = True
        if chunk.get("id"):
            self._id = "msg_" + strip_id(chunk["id"], "chatcmpl-")
        self._model = chunk.get("model") or self._model
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index, self._open, self._open_text = self._open, None, False
        return [{"type": "content_block_stop", "index": index}]

    def _open_block(self, block: dict[str, Any], *, text: bool) -> list[dict[str, Any]]:
        out = self._close()
        self._open, self._open_text = self._next_index, text
        self._next_index += 1
        out.append({"type": "content_block_start", "index": self._open, "content_block": block})
        return out

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        out = [] if self._started else self._start(event)
        for choice in event.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if not self._open_text:
                    out += self._open_block({"type": "text", "text": ""}, text=True)
                delta_event = {"type": "text_delta", "text": text}
                out.append(
                    {"type": "content_block_delta", "index": self._open, "delta": delta_event}
                )
            for call in delta.get("tool_calls") or ():
                position = call.get("index", 0)
                function = call.get("function") or {}
                if position not in self._tool_blocks:
                    block = {
                        "type": "tool_use",
                        "id": call.get("id") or f"toolu_{self._id}_{position}",
                        "name": function.get("name", ""),
                        "input": {},
                    }
                    out += self._open_block(block, text=False)
                    self._tool_blocks[position] = self._next_index - 1
                if function.get("arguments"):
                    json_delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
                    index = self._tool_blocks[position]
                    out.append({"type": "content_block_delta", "index": index, "delta": json_delta})
            if choice.get("finish_reason"):
                self._stop_reason = FINISH_TO_STOP.get(choice["finish_reason"], "end_turn")
        return out

    def finish(self, usage: Usage) -> list[dict[str, Any]]:
        out = [] if self._started else self._start({})
        out += self._close()
        out.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": self._stop_reason, "stop_sequence": None},
                "usage": usage.to_messages(),
            }
        )
        out.append({"type": "message_stop"})
        return out


class MessagesToChatStream:
    """Anthropic stream events -> OpenAI chat chunks, ending with a usage chunk."""

    def __init__(self, *, created_s: int, model: str | None = None) -> None:
        self._created_s = created_s
        self._model = model
        self._id = "chatcmpl-unknown"
        self._tool_of_block: dict[int, int] = {}  # block index -> chat tool-call index

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created_s,
            "model": self._model,
            "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            ],
        }

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self._id = "chatcmpl-" + strip_id(message.get("id"), "msg_")
            self._model = message.get("model") or self._model
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                position = len(self._tool_of_block)
                self._tool_of_block[event.get("index", 0)] = position
                call = {
                    "index": position,
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {"name": block.get("name", ""), "arguments": ""},
                }
                return [self._chunk({"tool_calls": [call]})]
            if block.get("type") == "text" and block.get("text"):
                return [self._chunk({"content": block["text"]})]
            return []
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                return [self._chunk({"content": delta.get("text", "")})]
            if delta.get("type") == "input_json_delta":
                position = self._tool_of_block.get(event.get("index", 0), 0)
                call = {"index": position, "function": {"arguments": delta.get("partial_json", "")}}
                return [self._chunk({"tool_calls": [call]})]
            return []
        if kind == "message_delta":
            reason = (event.get("delta") or {}).get("stop_reason")
            return [self._chunk({}, STOP_TO_FINISH.get(reason or "", "stop"))]
        return []

    def finish(self, usage: Usage) -> list[dict[str, Any]]:
        return [
            {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created_s,
                "model": self._model,
                "choices": [],
                "usage": usage.to_chat(),
            }
        ]
