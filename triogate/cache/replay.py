"""Streams and whole answers, both ways: what lets one cache entry serve both kinds of client.

The cache stores one shape per entry: the *complete* response body in the client's API
shape, the same whether the answer was streamed or not. :func:`assemble` turns the
events of a finished stream into that body (:mod:`triogate.cache.assembly`, re-exported
here; a streaming request feeds its :func:`assembler` each event as it passes instead of
keeping the events); :func:`replay` turns a body back into the
events a streaming client of that API expects. So a request cached by a non-streaming
client answers a streaming one, and the other way round.

``assemble`` is strict: anything it does not understand (an error event, an unknown
delta, a stream that never finished) makes it answer None, and nothing is cached. Not
caching is never wrong; caching half an answer is.

``replay`` emits what the official SDKs accumulate back into the same body: for chat, per
choice a role chunk, a content chunk, one chunk per tool call and a finish chunk, then a
usage chunk; for messages, ``message_start`` ... ``message_stop``; for responses,
``response.created`` ... ``response.completed``. Text goes out in one delta per block:
the answer is already complete, and slicing it would only add bytes.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import orjson

from triogate.cache.assembly import Assembler as Assembler
from triogate.cache.assembly import assemble as assemble
from triogate.cache.assembly import assembler as assembler

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from triogate.providers.records import Api

# =========================================================================== replay


def replay(api: Api, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The stream events a client of ``api`` expects, for the complete answer ``body``.

    Raises:
        ValueError: ``api`` has no streamed form (embeddings), or ``body`` is not an
            answer of that API.
    """
    replayers: dict[str, Callable[[Mapping[str, Any]], list[dict[str, Any]]]] = {
        "chat": _replay_chat,
        "messages": _replay_messages,
        "responses": _replay_responses,
    }
    if api not in replayers:
        raise ValueError(f"API {api!r} has no streamed form")
    try:
        return replayers[api](body)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a complete {api} answer: {exc!r}") from exc


def _replay_chat(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    base: dict[str, Any] = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body.get("created"),
        "model": body.get("model"),
    }
    for name in ("system_fingerprint", "service_tier"):
        if name in body:
            base[name] = body[name]

    def chunk(choice: dict[str, Any]) -> dict[str, Any]:
        return {**base, "choices": [{"finish_reason": None, "logprobs": None, **choice}]}

    chunks: list[dict[str, Any]] = []
    for choice in body["choices"]:
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        # The role goes alone first, as upstreams send it: the openai SDK copies a new
        # choice's first chunk whole and would count logprobs riding on it twice.
        chunks.append(chunk({"index": index, "delta": {"role": message.get("role") or
                                                       "assistant"}}))
        delta = {k: copy.deepcopy(v) for k, v in message.items() if k not in ("role",
                                                                             "tool_calls")}
        if delta or choice.get("logprobs") is not None:
            chunks.append(chunk({"index": index, "delta": delta,
                                 "logprobs": copy.deepcopy(choice.get("logprobs"))}))
        for position, call in enumerate(message.get("tool_calls") or ()):
            tool_call = {"index": position, **copy.deepcopy(call)}
            chunks.append(chunk({"index": index, "delta": {"tool_calls": [tool_call]}}))
        chunks.append(chunk({"index": index, "delta": {},
                             "finish_reason": choice.get("finish_reason") or "stop"}))
    if body.get("usage") is not None:
        chunks.append({**base, "choices": [], "usage": copy.deepcopy(body["usage"])})
    return chunks


def _block_events(index: int, block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``content_block_start`` / deltas for one Anthropic content block (stop excluded)."""
    kind = block.get("type")
    start = copy.deepcopy(dict(block))
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        start["text"] = ""
        if block.get("citations"):
            start["citations"] = None
            deltas += [{"type": "citations_delta", "citation": c} for c in block["citations"]]
        if block.get("text"):
            deltas.append({"type": "text_delta", "text": block["text"]})
    elif kind == "thinking":
        start["thinking"] = ""
        if block.get("thinking"):
            deltas.append({"type": "thinking_delta", "thinking": block["thinking"]})
        if "signature" in block:
            start["signature"] = ""
            if block["signature"]:
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "tool_use":
        start["input"] = {}
        if block.get("input"):
            deltas.append(
                {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
            )
    # Any other block (redacted thinking, server tool results, ...) starts complete.
    return [{"type": "content_block_start", "index": index, "content_block": start}] + [
        {"type": "content_block_delta", "index": index, "delta": copy.deepcopy(d)}
        for d in deltas
    ]


def _replay_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    usage = dict(body.get("usage") or {})
    message = {k: copy.deepcopy(v) for k, v in body.items() if k != "content"}
    message.update(content=[], stop_reason=None, stop_sequence=None,
                   usage={**usage, "output_tokens": 0})
    if "stop_details" in body:
        message["stop_details"] = None
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    for index, block in enumerate(body["content"]):
        events += _block_events(index, block)
        events.append({"type": "content_block_stop", "index": index})
    delta = {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}
    for name in ("stop_details", "container"):
        if body.get(name) is not None:
            delta[name] = copy.deepcopy(body[name])
    events.append({"type": "message_delta", "delta": delta, "usage": usage})
    events.append({"type": "message_stop"})
    return events


class _Sequenced:
    """Responses events carry a ``sequence_number`` counting from 0."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, "sequence_number": len(self.events), **fields})


def _replay_message_item(out: _Sequenced, index: int, item: Mapping[str, Any]) -> None:
    item_id = item["id"]
    where = {"item_id": item_id, "output_index": index}
    for position, part in enumerate(item.get("content") or ()):
        at = {**where, "content_index": position}
        kind = part.get("type")
        if kind == "output_text":
            logprobs = copy.deepcopy(part.get("logprobs") or [])
            out.add("response.content_part.added", **at, part={**copy.deepcopy(part), "text": ""})
            if part.get("text"):
                out.add("response.output_text.delta", **at, delta=part["text"], logprobs=logprobs)
            out.add("response.output_text.done", **at, text=part.get("text", ""),
                    logprobs=logprobs)
        elif kind == "refusal":
            out.add("response.content_part.added", **at, part={**part, "refusal": ""})
            out.add("response.refusal.delta", **at, delta=part.get("refusal", ""))
            out.add("response.refusal.done", **at, refusal=part.get("refusal", ""))
        else:
            out.add("response.content_part.added", **at, part=copy.deepcopy(part))
        out.add("response.content_part.done", **at, part=copy.deepcopy(part))


def _replay_responses(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = _Sequenced()
    pending = {**copy.deepcopy(dict(body)), "status": "in_progress", "output": [],
               "usage": None, "incomplete_details": None, "error": None}
    if "completed_at" in body:
        pending["completed_at"] = None
    out.add("response.created", response=pending)
    out.add("response.in_progress", response=copy.deepcopy(pending))
    for index, item in enumerate(body["output"]):
        kind = item.get("type")
        if kind == "message":
            added = {**copy.deepcopy(item), "status": "in_progress", "content": []}
        elif kind == "function_call":
            added = {**copy.deepcopy(item), "status": "in_progress", "arguments": ""}
        else:
            added = copy.deepcopy(item)
        out.add("response.output_item.added", output_index=index, item=added)
        if kind == "message":
            _replay_message_item(out, index, item)
        elif kind == "function_call":
            where = {"item_id": item["id"], "output_index": index}
            if item.get("arguments"):
                out.add("response.function_call_arguments.delta", **where,
                        delta=item["arguments"])
            out.add("response.function_call_arguments.done", **where,
                    arguments=item.get("arguments", ""))
        out.add("response.output_item.done", output_index=index, item=copy.deepcopy(item))
    final = "response.incomplete" if body.get("status") == "incomplete" else "response.completed"
    out.add(final, response=copy.deepcopy(dict(body)))
    return out.events
