"""Usage tracking of a stream: what the upstream reported, else what was counted so far.

A tracker watches the upstream's own events (its hub shape: OpenAI chat chunks or
Anthropic events), so ``usage`` answers at any moment, even after the client went away,
and knows whether the stream finished.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import orjson

from triogate.errors import ProviderProtocolError, ProviderStatusError
from triogate.providers.records import Usage
from triogate.providers.tokens import tokens_for_chars

if TYPE_CHECKING:
    from collections.abc import Mapping


class UsageTracker(Protocol):
    """Watches upstream events; knows the usage so far and whether the stream finished."""

    @property
    def usage(self) -> Usage: ...

    def observe(self, event: Mapping[str, Any]) -> None: ...

    def check_complete(self) -> None: ...


_NO_DELTA: Mapping[str, Any] = {}


class ChatUsageTracker:
    """Usage of an OpenAI chat-completion chunk stream.

    Args:
        input_tokens: the prompt estimate, used until (unless) the upstream reports.
    """

    def __init__(self, *, input_tokens: int) -> None:
        self._input_tokens = input_tokens
        self._output_chars = 0
        self._reported: Usage | None = None
        self._finished = False

    @property
    def usage(self) -> Usage:
        if self._reported is not None:
            return self._reported
        return Usage(
            input_tokens=self._input_tokens,
            output_tokens=tokens_for_chars(self._output_chars),
            reported=False,
        )

    def observe(self, event: Mapping[str, Any]) -> None:
        """Record one chunk. Raises ProviderStatusError for an in-stream error object."""
        if "error" in event and "choices" not in event:
            raise ProviderStatusError(500, orjson.dumps(dict(event)))
        if (usage := event.get("usage")) is not None:  # one chunk of a stream, if any
            reported = Usage.from_chat(usage)
            if reported is not None:
                self._reported = reported
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or _NO_DELTA
            content = delta.get("content")
            if isinstance(content, str):
                self._output_chars += len(content)
            if (calls := delta.get("tool_calls")) is not None:
                self._count_calls(calls)
            if choice.get("finish_reason"):
                self._finished = True

    def _count_calls(self, calls: Any) -> None:
        for call in calls or ():
            function = call.get("function") or {}
            for key in ("name", "arguments"):
                if isinstance(function.get(key), str):
                    self._output_chars += len(function[key])

    def check_complete(self) -> None:
        """Called at the end of the stream: it must have finished a choice (or reported)."""
        if not self._finished and self._reported is None:
            raise ProviderProtocolError("upstream stream ended before a finish_reason")


# Anthropic's in-stream error types and the HTTP status each one stands for.
_ANTHROPIC_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


class MessagesUsageTracker:
    """Usage of an Anthropic Messages event stream.

    Input tokens come in ``message_start``, output tokens (cumulative) in ``message_delta``;
    usage counts as reported once ``message_delta`` carried it.
    """

    def __init__(self, *, input_tokens: int) -> None:
        self._input_estimate = input_tokens
        self._input_reported: int | None = None
        self._output_reported: int | None = None
        self._output_chars = 0
        self._finished = False

    @property
    def usage(self) -> Usage:
        inputs = self._input_reported
        if inputs is not None and self._output_reported is not None:
            return Usage(input_tokens=inputs, output_tokens=self._output_reported)
        return Usage(
            input_tokens=self._input_estimate if inputs is None else inputs,
            output_tokens=tokens_for_chars(self._output_chars),
            reported=False,
        )

    def observe(self, event: Mapping[str, Any]) -> None:
        """Record one event. Raises ProviderStatusError for an ``error`` event."""
        kind = event.get("type")
        if kind == "error":
            error = event.get("error") or {}
            status = _ANTHROPIC_ERROR_STATUS.get(str(error.get("type")), 500)
            raise ProviderStatusError(status, orjson.dumps(dict(event)))
        if kind == "message_start":
            reported = Usage.from_messages((event.get("message") or {}).get("usage"))
            if reported is not None:
                self._input_reported = reported.input_tokens
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            for key in ("text", "partial_json", "thinking"):
                if isinstance(delta.get(key), str):
                    self._output_chars += len(delta[key])
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            if isinstance(block.get("text"), str):
                self._output_chars += len(block["text"])
            if isinstance(block.get("name"), str):
                self._output_chars += len(block["name"])
        elif kind == "message_delta":
            self._finished = True
            usage = event.get("usage") or {}
            if isinstance(usage.get("output_tokens"), int):
                self._output_reported = usage["output_tokens"]
            if isinstance(usage.get("input_tokens"), int) and self._input_reported is None:
                self._input_reported = usage["input_tokens"]
        elif kind == "message_stop":
            self._finished = True

    def check_complete(self) -> None:
        if not self._finished:
            raise ProviderProtocolError("upstream stream ended before message_stop")
