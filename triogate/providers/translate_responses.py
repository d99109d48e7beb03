"""OpenAI Responses API <-> chat completions: requests in, responses and streams out.

triogate is stateless towards the Responses API: it stores no responses, so
``previous_response_id`` and item references are refused (``TranslationError``, a 400 to the
client) rather than silently ignored. Function tools are translated; hosted tools
(web search, file search, ...) are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.errors import TranslationError
from triogate.providers.translate_chat_messages import strip_id

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.providers.records import Usage

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


# --------------------------------------------------------------------------- requests


def _input_part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        return {"type": "text", "text": part.get("text", part.get("refusal", ""))}
    if kind == "input_image":
        url = part.get("image_url")
        if not url:
            raise TranslationError("input_image needs image_url (file ids are not supported)")
        detail = {"detail": part["detail"]} if part.get("detail") else {}
        return {"type": "image_url", "image_url": {"url": url, **detail}}
    raise TranslationError(f"input content of type {kind!r} is not supported")


def _message(item: Mapping[str, Any]) -> dict[str, Any]:
    role = _ROLES.get(item.get("role", ""))
    if role is None:
        raise TranslationError(f"input message role {item.get('role')!r} is not supported")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = [_input_part(p) for p in content or ()]
    if role != "user" or all(p["type"] == "text" for p in parts):
        if any(p["type"] != "text" for p in parts):
            raise TranslationError(f"{role} messages can only carry text")
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise TranslationError(f"tool of type {tool.get('type')!r} is not supported by triogate")
    function = {"name": tool.get("name", "")}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    raise TranslationError(f"tool_choice {choice!r} is not supported")


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise TranslationError(f"text.format {fmt.get('type')!r} is not supported")


def responses_to_chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses API request as an OpenAI chat request.

    ``input`` may be a string or a list of items: messages, ``function_call`` and
    ``function_call_output``. ``instructions`` becomes the first system message.

    Raises:
        TranslationError: ``previous_response_id``, item references, hosted tools, ...
    """
    if body.get("previous_response_id"):
        raise TranslationError(
            "previous_response_id is not supported: triogate stores no responses")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        items = []
    for item in items or ():
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item))
        elif kind == "function_call":
            call = {
                "id": item.get("call_id", ""),
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = (
                output
                if isinstance(output, str)
                else "".join(p.get("text", "") for p in output or () if isinstance(p, dict))
            )
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id", ""), "content": text}
            )
        elif kind == "reasoning":
            continue
        else:
            raise TranslationError(f"input item of type {kind!r} is not supported")
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for key in ("temperature", "top_p", "stream", "parallel_tool_calls", "user"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        out["tools"] = [_tool(t) for t in body["tools"]]
        if body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _response_format(body.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    return out


# --------------------------------------------------------------------------- responses


def _incomplete(finish_reason: str | None) -> dict[str, str] | None:
    if finish_reason == "length":
        return {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return {"reason": "content_filter"}
    return None


def response_object(
    *,
    response_id: str,
    request: Mapping[str, Any],
    model: Any,
    created_s: int,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    incomplete: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Responses API ``response`` object, echoing the request's settings."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_s,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model or request.get("model"),
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "store": False,
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": list(request.get("tools") or ()),
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": usage.to_responses() if usage is not None else None,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": []}]
        if status != "in_progress"
        else []
    )
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": "fc_" + strip_id(call_id, "call_", "toolu_"),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def chat_to_responses_response(
    response: Mapping[str, Any], *, request: Mapping[str, Any], usage: Usage, created_s: int
) -> dict[str, Any]:
    """An OpenAI chat completion as a Responses API ``response`` object."""
    suffix = strip_id(response.get("id"), "chatcmpl-")
    choice = (response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(_message_item(f"msg_{suffix}", str(message["content"]), "completed"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        output.append(
            _call_item(
                call.get("id", ""),
                function.get("name", ""),
                function.get("arguments", ""),
                "completed",
            )
        )
    incomplete = _incomplete(choice.get("finish_reason"))
    return response_object(
        response_id=f"resp_{suffix}",
        request=request,
        model=response.get("model"),
        created_s=created_s,
        status="incomplete" if incomplete else "completed",
        output=output,
        usage=usage,
        incomplete=incomplete,
    )


class ChatToResponsesStream:
    """OpenAI chat chunks -> Responses API stream events, each with ``sequence_number``."""

    def __init__(self, *, request: Mapping[str, Any], created_s: int) -> None:
        self._request = request
        self._created_s = created_s
        self._sequence = 0
        self._started = False
        self._suffix = "unknown"
        self._model: Any = None
        self._output: list[dict[str, Any]] = []  # finished items, in output order
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._open_text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> item
        self._finish_reason: str | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _response(self, status: str, usage: Usage | None) -> dict[str, Any]:
        incomplete = _incomplete(self._finish_reason) if status != "in_progress" else None
        return response_object(
            response_id=f"resp_{self._suffix}",
            request=self._request,
            model=self._model,
            created_s=self._created_s,
            status=status,
            output=list(self._output),
            usage=usage,
            incomplete=incomplete,
        )

    def _start(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        self._started = True
        self._suffix = strip_id(chunk.get("id"), "chatcmpl-")
        self._model = chunk.get("model")
        response = self._response("in_progress", None)
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def _close(self) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        self._open = None
        index = len(self._output)
        if item["type"] == "message":
            text = "".join(self._open_text)
            done = _message_item(item["id"], text, "completed")
            part = done["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events = [
                self._event("response.output_text.done", **where, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, part=part),
            ]
        else:
            done = {**item, "status": "completed"}
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            ]
        self._output.append(done)
        events.append(self._event("response.output_item.done", output_index=index, item=done))
        return events

    def _open_item(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self._open = item
        index = len(self._output)
        events.append(
            self._event("response.output_item.added", output_index=index, item=dict(item))
        )
        if item["type"] == "message":
            self._open_text = []
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
        return events

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        out = [] if self._started else self._start(event)
        for choice in event.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self._open is None or self._open["type"] != "message":
                    out += self._open_item(_message_item(f"msg_{self._suffix}", "", "in_progress"))
                self._open_text.append(text)
                out.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self._open["id"],  # type: ignore[index]
                        output_index=len(self._output),
                        content_index=0,
                        delta=text,
                        logprobs=[],
                    )
                )
            for call in delta.get("tool_calls") or ():
                position = call.get("index", 0)
                function = call.get("function") or {}
                if position not in self._calls:
                    call_id = call.get("id") or f"call_{self._suffix}_{position}"
                    item = _call_item(call_id, function.get("name", ""), "", "in_progress")
                    self._calls[position] = item
                    out += self._open_item(item)
                arguments = function.get("arguments")
                item = self._calls[position]
                # Upstreams stream tool calls one after another; arguments for a call
                # already closed (interleaved) cannot be expressed and are dropped.
                if arguments and item is self._open:
                    item["arguments"] += arguments
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=item["id"],
                            output_index=len(self._output),
                            delta=arguments,
                        )
                    )
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return out

    def finish(self, usage: Usage) -> list[dict[str, Any]]:
        out = [] if self._started else self._start({})
        out += self._close()
        incomplete = _incomplete(self._finish_reason)
        status = "incomplete" if incomplete else "completed"
        out.append(self._event(f"response.{status}", response=self._response(status, usage)))
        return out
