"""A finished stream's complete answer, assembled event by event as the stream passes.

:func:`assemble` (re-exported by :mod:`triogate.cache.replay`, which describes both
directions) turns a finished stream's events into the complete response body the cache
stores. It is implemented on an :class:`Assembler` per API, which a streaming request feeds
each event as it forwards it (``api/flow.py``), so that nothing has to keep the stream's
events (or their wire bytes) until its end and parse them a second time: ~90 MB and
~1 µs per chunk at 4,096 streams of 100 chunks (``bench/streams.py``).

An assembler keeps only what the body needs: the head fields, per choice or block the text
pieces as strings (joined at the end), tool calls, usage. It never keeps an event dict
itself. Where the batch code always deep-copied (a chat delta's objects, the Anthropic
message and its blocks, the final Responses object), it copies when it takes the object;
the few sub-objects it always held as they came (the last chat usage, logprob entries,
citations, finished Responses items) it still holds by reference: the streams that feed it
hand each event out once, freshly parsed (``RawStream``) or freshly built (the
translators), and nothing changes an event afterwards.

Strict, as ever: anything not understood (an error event, an unknown delta, an event out
of order, a malformed event raising ``KeyError``, ``TypeError``, ...) makes the assembler
answer None from then on, as does a stream that never finished. One code path: ``assemble``
feeds an assembler the list, so the two give the same body for every input.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from triogate.providers.records import Api

# Chat delta fields that are set, not concatenated, when a later chunk repeats them
# (some OpenAI-compatible servers repeat the tool call's id and name in every chunk).
_SET_KEYS = frozenset({"role", "index", "type", "id", "name"})

# Text pieces are joined once this many are waiting: a piece of a few characters is a str
# object of ~55 bytes, so 4,096 streams of 100 chunks held ~35 MB of them, ~20 MB joined
# this way (bench/streams.py). Each join copies the text so far again: for an
# answer of n pieces ~n²/(2·64) piece copies in all, ~2 ms for a 64 kB answer in 16k pieces,
# against ~0.5 s of forwarding them.
_JOIN_AT = 64


def _add_piece(pieces: list[str], piece: str) -> None:
    """Append ``piece`` to a string's waiting pieces, joined once :data:`_JOIN_AT` wait."""
    pieces.append(piece)
    if len(pieces) > _JOIN_AT:
        pieces[:] = ("".join(pieces),)

# A malformed event (a missing key, a value of the wrong type, ...): not an answer we can
# vouch for. RecursionError too: a value nested a few hundred deep parses (orjson allows
# 1,024) but not copies, and an assembler fed inside a stream's loop must not end the
# stream for the cache's sake (the batch code before raised it from settlement).
_MALFORMED = (KeyError, TypeError, AttributeError, ValueError, IndexError, RecursionError)


def assemble(api: Api, events: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
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
    assembly = assembler(api)
    if assembly is None:
        return None
    for event in events:
        assembly.feed(event)
    return assembly.result()


def assembler(api: Api) -> Assembler | None:
    """A new assembler for a stream of ``api``; None for an API that does not stream."""
    kind = _ASSEMBLERS.get(api)
    return kind() if kind is not None else None


class Assembler:
    """Feed it a stream's events in order (:meth:`feed`), then ask for the body
    (:meth:`result`). :meth:`feed` never raises for what an event holds."""

    __slots__ = ("_body", "_over")

    def __init__(self) -> None:
        self._over = False  # refused (None) for good, or the result taken
        self._body: dict[str, Any] | None = None

    def feed(self, event: Mapping[str, Any]) -> None:
        """Fold one event into the answer (nothing once it is refused)."""
        raise NotImplementedError

    def result(self) -> dict[str, Any] | None:
        """The complete body, or None (see :func:`assemble`). The stream must have ended:
        the first call finishes the assembly, later calls give the same answer, and
        events fed after it are ignored."""
        if not self._over:
            self._over = True
            try:
                self._body = self._finish()
            except _MALFORMED:
                self._body = None
        return self._body

    def _finish(self) -> dict[str, Any] | None:
        raise NotImplementedError


# =========================================================================== chat


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
    current = state["logprobs"]
    if current is None:
        state["logprobs"] = copy.deepcopy(dict(logprobs))
        return
    for key in ("content", "refusal"):
        if logprobs.get(key):
            # The list is the assembler's own (a copy, or made here): extended in place,
            # not copied whole per chunk.
            if mine := current.get(key):
                mine.extend(logprobs[key])
            else:
                current[key] = list(logprobs[key])


_HEAD_NAMES = ("id", "created", "model", "system_fingerprint", "service_tier")


def _named(head: dict[str, Any], missing: tuple[str, ...], event: Mapping[str, Any]
           ) -> tuple[str, ...]:
    """Take the head fields ``event`` names first; the ones still missing."""
    for name in missing:
        if event.get(name) is not None:
            head[name] = event[name]
    return tuple(name for name in missing if name not in head)


class ChatAssembler(Assembler):
    """``chat.completion.chunk`` events -> a ``chat.completion``."""

    __slots__ = ("_args", "_choices", "_head", "_missing", "_texts", "_usage")

    def __init__(self) -> None:
        super().__init__()
        self._head: dict[str, Any] = {}
        self._missing: tuple[str, ...] = _HEAD_NAMES  # head fields not named (not None) yet
        self._choices: dict[int, dict[str, Any]] = {}
        # Per choice whose message content is a string so far: the pieces to append to it.
        # A delta of content alone (nearly every chunk) is one list append; the pieces are
        # joined when another delta reaches that message, and at the end (~5 % of a
        # streaming worker went to merging each chunk with _merge_delta).
        self._texts: dict[int, list[str]] = {}
        # The same for a tool call's arguments: (choice, call) -> the call's ``function``
        # object and the pieces to append to its arguments. Appended one ``+=`` per chunk,
        # a call's arguments were copied whole per chunk: 20,000 chunks of 20 characters
        # (a 400 kB argument, a file an agent writes) took 1.2 s.
        self._args: dict[tuple[int, Any], tuple[dict[str, Any], list[str]]] = {}
        self._usage: Any = None

    def feed(self, event: Mapping[str, Any]) -> None:
        if self._over:
            return
        try:
            if event.get("object") != "chat.completion.chunk" or "error" in event:
                self._over = True
                return
            for name in self._missing:
                if event.get(name) is not None:
                    self._missing = _named(self._head, self._missing, event)
                    break
            if (value := event.get("usage")) is not None:
                self._usage = value
            choices = self._choices
            texts = self._texts
            for choice in event.get("choices") or ():
                index = choice.get("index", 0)
                delta = choice.get("delta") or {}
                pieces = texts.get(index)
                if pieces is not None and len(delta) == 1 and isinstance(
                        text := delta.get("content"), str):
                    _add_piece(pieces, text)
                    state = choices[index]
                else:
                    if index in choices:
                        state = choices[index]
                    else:
                        state = choices[index] = {"index": index, "message": {},
                                                  "finish_reason": None, "logprobs": None}
                    if delta and not self._arguments_only(index, state, delta):
                        self._join_arguments(index)
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
        except _MALFORMED:
            self._over = True

    def _arguments_only(self, index: int, state: dict[str, Any],
                        delta: Mapping[str, Any]) -> bool:
        """Fold ``delta`` in if it only appends to the arguments of a tool call the message
        has (nearly every chunk of a tool call: ``{"tool_calls": [{"index": i,
        "function": {"arguments": "..."}}]}``): one list append. False: it is any other
        delta, for ``_merge_delta``."""
        if len(delta) != 1:
            return False
        calls = delta.get("tool_calls")
        if not isinstance(calls, list) or len(calls) != 1:
            return False
        call = calls[0]
        if not isinstance(call, dict) or len(call) != 2:
            return False
        function, position = call.get("function"), call.get("index")
        if not isinstance(function, dict) or len(function) != 1:
            return False
        piece = function.get("arguments")
        if not isinstance(piece, str):
            return False
        key = (index, position)
        waiting = self._args.get(key)
        if waiting is None:
            # As _merge_delta: the call at that index, whose arguments are a string so far.
            existing = next((c for c in state["message"].get("tool_calls") or ()
                             if c["index"] == position), None)
            target = existing.get("function") if existing is not None else None
            if not isinstance(target, dict) or not isinstance(target.get("arguments"), str):
                return False
            waiting = self._args[key] = (target, [target["arguments"]])
        _add_piece(waiting[1], piece)
        return True

    def _join_arguments(self, index: int | None = None) -> None:
        """Put the waiting argument pieces of choice ``index`` (None: of every choice)
        into their calls, before anything else reaches those messages."""
        if not self._args:
            return
        for key in [k for k in self._args if index is None or k[0] == index]:
            target, pieces = self._args.pop(key)
            target["arguments"] = "".join(pieces)

    def _finish(self) -> dict[str, Any] | None:
        choices = self._choices
        self._join_arguments()
        for index, pieces in self._texts.items():
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
                message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"}
                                         for c in calls]
            out_choices.append(state)
        head = self._head
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
        if self._usage is not None:
            body["usage"] = copy.deepcopy(self._usage)
        return body


# =========================================================================== messages


class MessagesAssembler(Assembler):
    """Anthropic ``message_start`` ... ``message_stop`` -> the ``message``."""

    __slots__ = ("_blocks", "_json_parts", "_message", "_stopped", "_texts")

    def __init__(self) -> None:
        super().__init__()
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json_parts: dict[int, list[str]] = {}
        # Per (block index, field) of a text or thinking block: the pieces of that string
        # field so far, joined at the end (one append per delta instead of copying the
        # whole text each time). The field is in the block already, in its place.
        self._texts: dict[tuple[int, str], list[str]] = {}
        self._stopped = False

    def feed(self, event: Mapping[str, Any]) -> None:
        if self._over:
            return
        try:
            kind = event.get("type")
            if kind == "content_block_delta":  # nearly every event
                if self._message is None or self._stopped:
                    self._over = True  # out of order: before message_start or after stop
                elif not self._delta(event["index"], event["delta"]):
                    self._over = True
            elif kind == "ping":
                pass
            elif kind == "message_start":
                self._message = copy.deepcopy(dict(event["message"]))
            elif self._message is None or self._stopped:
                self._over = True  # out of order: before message_start or after stop
            elif kind == "content_block_start":
                index = event["index"]
                self._blocks[index] = copy.deepcopy(dict(event["content_block"]))
                self._drop_texts(index)  # the block they belonged to is replaced
            elif kind == "content_block_stop":
                index = event["index"]
                if index in self._json_parts:
                    text = "".join(self._json_parts.pop(index))
                    self._blocks[index]["input"] = orjson.loads(text) if text.strip() else {}
            elif kind == "message_delta":
                message = self._message
                message.update(copy.deepcopy(dict(event.get("delta") or {})))
                usage = message.setdefault("usage", {})
                usage.update({k: v for k, v in (event.get("usage") or {}).items()
                              if v is not None})
            elif kind == "message_stop":
                self._stopped = True
            else:
                self._over = True  # "error", or an event we do not know
        except _MALFORMED:
            self._over = True

    def _delta(self, index: Any, delta: Mapping[str, Any]) -> bool:
        """Apply one ``content_block_delta``; False for a delta this module does not know."""
        block = self._blocks[index]
        kind = delta.get("type")
        if kind == "text_delta":
            self._append(index, block, "text", delta["text"])
        elif kind == "input_json_delta":
            self._json_parts.setdefault(index, []).append(delta["partial_json"])
        elif kind == "thinking_delta":
            self._append(index, block, "thinking", delta["thinking"])
        elif kind == "signature_delta":
            block["signature"] = delta["signature"]
        elif kind == "citations_delta":
            block["citations"] = [*(block.get("citations") or []), delta["citation"]]
        else:
            return False
        return True

    def _append(self, index: Any, block: dict[str, Any], field: str, piece: Any) -> None:
        """``block[field] = block.get(field, "") + piece``, kept as pieces while the field
        is a string (raising as that would for anything else)."""
        pieces = self._texts.get((index, field))
        if pieces is not None:
            if not isinstance(piece, str):
                raise TypeError(f"a {field} piece is not a string")
            _add_piece(pieces, piece)
            return
        value = block[field] = block.get(field, "") + piece  # a new field takes its place
        if isinstance(value, str):
            self._texts[index, field] = [value]

    def _drop_texts(self, index: Any) -> None:
        for field in ("text", "thinking"):
            self._texts.pop((index, field), None)

    def _finish(self) -> dict[str, Any] | None:
        message = self._message
        if message is None or not self._stopped or self._json_parts:
            return None
        blocks = self._blocks
        for (index, field), pieces in self._texts.items():
            blocks[index][field] = "".join(pieces)
        message["content"] = list(message.get("content") or []) + [blocks[i]
                                                                    for i in sorted(blocks)]
        return message


# =========================================================================== responses

_RESPONSE_DONE = ("response.completed", "response.incomplete")


class ResponsesAssembler(Assembler):
    """Responses events -> the ``response`` of ``response.completed`` (or
    ``response.incomplete``)."""

    __slots__ = ("_final", "_items")

    def __init__(self) -> None:
        super().__init__()
        self._final: dict[str, Any] | None = None
        self._items: dict[int, Any] = {}

    def feed(self, event: Mapping[str, Any]) -> None:
        if self._over:
            return
        try:
            kind = event.get("type")
            if kind in ("error", "response.failed"):
                self._over = True
            elif kind in _RESPONSE_DONE:
                self._final = copy.deepcopy(dict(event["response"]))
            elif kind == "response.output_item.done":
                self._items[event["output_index"]] = event["item"]
        except _MALFORMED:
            self._over = True

    def _finish(self) -> dict[str, Any] | None:
        final = self._final
        if final is None:
            return None
        items = self._items
        if not final.get("output") and items:
            # Some upstreams leave the final output empty; the finished items are the answer.
            final["output"] = [copy.deepcopy(items[i]) for i in sorted(items)]
        return final


_ASSEMBLERS: dict[str, type[Assembler]] = {
    "chat": ChatAssembler,
    "messages": MessagesAssembler,
    "responses": ResponsesAssembler,
}
