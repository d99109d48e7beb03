"""The batch ``assemble`` as it was before the incremental assemblers
(``triogate/cache/replay.py``), verbatim: the reference ``test_assembly.py`` holds the
new code to. Not imported by triogate."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from triogate.providers.records import Api

# Chat delta fields that are set, not concatenated, when a later chunk repeats them
# (some OpenAI-compatible servers repeat the tool call's id and name in every chunk).
_SET_KEYS = frozenset({"role", "index", "type", "id", "name"})


# =========================================================================== assemble


def assemble(api: Api, events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The complete response body of a finished stream, in the client's API shape.

    Args:
        api: the client's API (``chat``, ``messages`` or ``responses``).
        events: every event the client was sent, in order (for chat including the usage
            chunk, whether or not the client asked for it).

    Returns:
        chat: a ``chat.completion`` (every choice with its message, tool calls,
        finish_reason and logprobs; ``usage`` when a chunk carried it). messages: the
        Anthropic ``message``. responses: the ``response`` object of
        ``response.completed`` (or ``response.incomplete``). None when the stream did not
        finish, carried an error, or holds something this function does not understand.
    """
    try:
        if api == "chat":
            return _assemble_chat(events)
        if api == "messages":
            return _assemble_messages(events)
        if api == "responses":
            return _assemble_responses(events)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError):
        return None  # a malformed event: not an answer we can vouch for
    return None


def _merge_delta(target: dict[str, Any], delta: Mapping[str, Any]) -> None:
    """Fold one chat delta into the message so far: strings append, objects merge."""
    for key, value in delta.items():
        if key == "tool_calls" and isinstance(value, list):
            calls: list[dict[str, Any]] = target.setdefault("tool_calls", [])
            for call in value:
                position = call["index"]
                existing = next((c for c in calls if c["index"] == position), None)
                if existing is None:
                    calls.append(copy.deepcopy(dict(call)))
                else:
                    _merge_delta(existing, call)
        elif value is None:
            target.setdefault(key, None)
        elif isinstance(value, str) and key not in _SET_KEYS and isinstance(target.get(key), str):
            target[key] += value
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_delta(target[key], value)
        elif isinstance(value, list) and isinstance(target.get(key), list):
            target[key].extend(copy.deepcopy(value))
        else:
            target[key] = copy.deepcopy(value)


def _merge_logprobs(state: dict[str, Any], logprobs: Any) -> None:
    if not logprobs:
        return
    current = state["logprobs"]
    if current is None:
        state["logprobs"] = copy.deepcopy(dict(logprobs))
        return
    for key in ("content", "refusal"):
        if logprobs.get(key):
            current[key] = (current.get(key) or []) + list(logprobs[key])


_HEAD_NAMES = ("id", "created", "model", "system_fingerprint", "service_tier")


def _named(head: dict[str, Any], missing: tuple[str, ...], event: Mapping[str, Any]
           ) -> tuple[str, ...]:
    """Take the head fields ``event`` names first; the ones still missing."""
    for name in missing:
        if event.get(name) is not None:
            head[name] = event[name]
    return tuple(name for name in missing if name not in head)


def _assemble_chat(events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    head: dict[str, Any] = {}
    missing: tuple[str, ...] = _HEAD_NAMES  # head fields no event has named (not None) yet
    choices: dict[int, dict[str, Any]] = {}
    # Per choice whose message content is a string so far: the pieces to append to it.
    # A delta of content alone (nearly every chunk) is one list append; the pieces are
    # joined when another delta reaches that message, and at the end (~5 % of a streaming
    # worker went to merging each chunk with _merge_delta).
    texts: dict[int, list[str]] = {}
    usage: Any = None
    for event in events:
        if event.get("object") != "chat.completion.chunk" or "error" in event:
            return None
        for name in missing:
            if event.get(name) is not None:
                missing = _named(head, missing, event)
                break
        if (value := event.get("usage")) is not None:
            usage = value
        for choice in event.get("choices") or ():
            index = choice.get("index", 0)
            delta = choice.get("delta") or {}
            pieces = texts.get(index)
            if pieces is not None and len(delta) == 1 and isinstance(
                    text := delta.get("content"), str):
                pieces.append(text)
                state = choices[index]
            else:
                if index in choices:
                    state = choices[index]
                else:
                    state = choices[index] = {"index": index, "message": {},
                                              "finish_reason": None, "logprobs": None}
                if delta:
                    message = state["message"]
                    if pieces is not None:
                        message["content"] = "".join(pieces)
                        del texts[index]
                    _merge_delta(message, delta)
                    if isinstance(content := message.get("content"), str):
                        texts[index] = [content]
            if logprobs := choice.get("logprobs"):
                _merge_logprobs(state, logprobs)
            if finish := choice.get("finish_reason"):
                state["finish_reason"] = finish
    for index, pieces in texts.items():
        choices[index]["message"]["content"] = "".join(pieces)
    if not choices or any(c["finish_reason"] is None for c in choices.values()):
        return None
    out_choices = []
    for index in sorted(choices):
        state = choices[index]
        message = state["message"]
        message.setdefault("role", "assistant")
        message.setdefault("content", None)
        calls = message.get("tool_calls")
        if calls:
            calls.sort(key=lambda c: c["index"])
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        out_choices.append(state)
    body: dict[str, Any] = {
        "id": head.get("id"),
        "object": "chat.completion",
        "created": head.get("created"),
        "model": head.get("model"),
        "choices": out_choices,
    }
    for name in ("system_fingerprint", "service_tier"):
        if name in head:
            body[name] = head[name]
    if usage is not None:
        body["usage"] = copy.deepcopy(usage)
    return body


def _assemble_messages(events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    json_parts: dict[int, list[str]] = {}
    stopped = False
    for event in events:
        kind = event.get("type")
        if kind == "ping":
            continue
        if kind == "message_start":
            message = copy.deepcopy(dict(event["message"]))
            continue
        if message is None or stopped:
            return None  # out of order: nothing may come before message_start or after stop
        if kind == "content_block_start":
            blocks[event["index"]] = copy.deepcopy(dict(event["content_block"]))
        elif kind == "content_block_delta":
            if not _apply_block_delta(blocks[event["index"]], event["delta"], json_parts,
                                      event["index"]):
                return None
        elif kind == "content_block_stop":
            index = event["index"]
            if index in json_parts:
                text = "".join(json_parts.pop(index))
                blocks[index]["input"] = orjson.loads(text) if text.strip() else {}
        elif kind == "message_delta":
            message.update(copy.deepcopy(dict(event.get("delta") or {})))
            usage = message.setdefault("usage", {})
            usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            stopped = True
        else:
            return None  # "error", or an event we do not know
    if message is None or not stopped or json_parts:
        return None
    message["content"] = list(message.get("content") or []) + [blocks[i] for i in sorted(blocks)]
    return message


def _apply_block_delta(
    block: dict[str, Any], delta: Mapping[str, Any], json_parts: dict[int, list[str]], index: int
) -> bool:
    """Apply one ``content_block_delta``; False for a delta this module does not know."""
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta["text"]
    elif kind == "input_json_delta":
        json_parts.setdefault(index, []).append(delta["partial_json"])
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta["thinking"]
    elif kind == "signature_delta":
        block["signature"] = delta["signature"]
    elif kind == "citations_delta":
        block["citations"] = [*(block.get("citations") or []), delta["citation"]]
    else:
        return False
    return True


_RESPONSE_DONE = ("response.completed", "response.incomplete")


def _assemble_responses(events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    final: dict[str, Any] | None = None
    items: dict[int, Any] = {}
    for event in events:
        kind = event.get("type")
        if kind in ("error", "response.failed"):
            return None
        if kind in _RESPONSE_DONE:
            final = copy.deepcopy(dict(event["response"]))
        elif kind == "response.output_item.done":
            items[event["output_index"]] = event["item"]
    if final is None:
        return None
    if not final.get("output") and items:
        # Some upstreams leave the final output empty; the finished items are the answer.
        final["output"] = [copy.deepcopy(items[i]) for i in sorted(items)]
    return final
