"""What every provider is: the Provider protocol and its records (a leaf module).

A provider takes a request body in the *client's* API shape (``api``), calls its upstream
in whatever shape that upstream speaks, and answers in the client's shape again. The
records here (:class:`Usage`, :class:`Completion`) and the protocols (:class:`Provider`,
:class:`ProviderStream`) are what the rest of the gateway sees of providers; this module
imports no other module of the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping
    from contextlib import AbstractAsyncContextManager

    from triogate.config import Deployment

Api = Literal["chat", "messages", "responses", "embeddings", "moderations"]
APIS: tuple[Api, ...] = ("chat", "messages", "responses", "embeddings", "moderations")


#: Request fields that mean something to the gateway only; never sent upstream.
GATEWAY_ONLY_FIELDS = frozenset({"mock_response"})


@attrs.frozen(kw_only=True)
class Usage:
    """Tokens of one call. ``reported`` is False when triogate counted them itself."""

    input_tokens: int
    output_tokens: int
    reported: bool = True

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_chat(self) -> dict[str, int]:
        """The ``usage`` object of an OpenAI chat completion."""
        return {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
        }

    def to_messages(self) -> dict[str, int]:
        """The ``usage`` object of an Anthropic message."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    def to_responses(self) -> dict[str, Any]:
        """The ``usage`` object of an OpenAI Responses API response."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_chat(cls, usage: Any) -> Usage | None:
        """Parse an OpenAI ``usage`` object; None when absent or malformed."""
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return None
        return cls(input_tokens=prompt, output_tokens=completion)

    @classmethod
    def from_messages(cls, usage: Any) -> Usage | None:
        """Parse an Anthropic ``usage`` object (cache reads and writes count as input)."""
        if not isinstance(usage, dict):
            return None
        inputs, outputs = usage.get("input_tokens"), usage.get("output_tokens")
        if not isinstance(inputs, int) or not isinstance(outputs, int):
            return None
        cached = sum(
            v
            for k in ("cache_creation_input_tokens", "cache_read_input_tokens")
            if isinstance(v := usage.get(k), int)
        )
        return cls(input_tokens=inputs + cached, output_tokens=outputs)


@attrs.frozen(kw_only=True)
class Completion:
    """A whole (non-streamed) answer, already in the client's API shape."""

    body: dict[str, Any]
    usage: Usage


class ProviderStream(Protocol):
    """Async iterator of events in the client's API shape (dicts).

    ``usage`` is the upstream's report once seen, else what triogate counted so far: it
    is meaningful mid-stream and after the client went away.
    """

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]: ...

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if no read is needed for it, else None (not a checkpoint)."""
        ...

    @property
    def usage(self) -> Usage: ...

    @property
    def wire(self) -> bytes | None:
        """The event handed out last as it goes on the wire to a client of the same API
        (SSE framing included: for chat, ``data: <its JSON>`` and a blank line; for
        messages, an ``event: <type>`` line first), or None: the caller encodes it."""
        ...


class Provider(Protocol):
    """An upstream model provider (OpenAI-compatible, Anthropic, mock)."""

    async def complete(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> Completion:
        """Call the upstream and return the whole answer (a checkpoint)."""
        ...

    def stream(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> AbstractAsyncContextManager[ProviderStream]:
        """Open a streamed call; leaving the context closes the upstream response."""
        ...
