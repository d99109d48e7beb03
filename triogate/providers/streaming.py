"""Streams: an SSE parser, usage trackers, and the ProviderStream every provider returns.

A provider stream is three small parts in a row::

    source (upstream events, as dicts)  ->  tracker (usage)  ->  translator (client shape)

The *source* is an SSE body from httpx (:class:`SSESource`) or the mock's timed chunks.
The *tracker* watches the upstream's own events (its "hub" shape: OpenAI chat chunks or
Anthropic events) for reported usage and counts the text streamed so far, so ``usage``
answers at any moment, even after the client went away. The *translator* turns each
upstream event into zero or more events of the client's API.
"""

from __future__ import annotations

import collections
import contextlib
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import orjson
import trio

from triogate.errors import ProviderProtocolError, ProviderStatusError
from triogate.providers.base import (
    SHAPE_ERRORS,
    Usage,
    map_exceptions,
    request_timeout,
    upstream_body,
    upstream_status_error,
)
from triogate.providers.tokens import estimate_input_tokens, tokens_for_chars

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    import httpx

    from triogate.config import Deployment
    from triogate.providers.base import Api
    from triogate.providers.translate import Hub

# --------------------------------------------------------------------------- SSE


@attrs.frozen(kw_only=True)
class ServerSentEvent:
    """One dispatched SSE event (``event`` defaults to "message", as the spec says)."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry_ms: int | None = None


class SSEDecoder:
    """Incremental SSE parser over raw bytes (WHATWG "server-sent events" rules).

    Lines end in LF, CRLF or CR, even when a CRLF is split across two chunks. Lines
    starting with ``:`` are comments. Several ``data:`` lines join with LF. An event is
    dispatched at a blank line; at end of input a pending event is dispatched too (the
    spec drops it, but an upstream that forgets the last blank line still meant it).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skip_lf = False  # the previous chunk ended in CR: a leading LF belongs to it
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Parse ``chunk``; return the events it completed (often none, sometimes many)."""
        if not chunk:
            return []  # and keep _skip_lf for the chunk that brings the LF
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        self._buffer += chunk
        events: list[ServerSentEvent] = []
        start = 0
        buffer = self._buffer
        while True:
            cr, lf = buffer.find(b"\r", start), buffer.find(b"\n", start)
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                end, after = cr, cr + 1
                if after < len(buffer) and buffer[after] == 0x0A:
                    after += 1
                elif after == len(buffer):
                    self._skip_lf = True
            else:
                end, after = lf, lf + 1
            event = self._line(bytes(buffer[start:end]).decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
            start = after
        del buffer[:start]
        return events

    def close(self) -> list[ServerSentEvent]:
        """End of input: the last unterminated line and event, if any."""
        events: list[ServerSentEvent] = []
        if self._buffer:
            event = self._line(bytes(self._buffer).decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
            self._buffer.clear()
        event = self._line("")
        if event is not None:
            events.append(event)
        return events

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "retry" and value.isdigit():
            self._retry_ms = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        if not self._data:
            self._event = ""
            return None
        event = ServerSentEvent(
            event=self._event or "message",
            data="\n".join(self._data),
            id=self._id,
            retry_ms=self._retry_ms,
        )
        self._event, self._data = "", []
        return event


# --------------------------------------------------------------------------- sources


class EventSource(Protocol):
    """Upstream events as dicts; None once the upstream said it is done."""

    async def next_event(self) -> dict[str, Any] | None: ...

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if it is already read and decodes cleanly; else None (then
        ``next_event`` reads, ends the stream or raises). Never blocks, never raises."""
        ...


class SSESource:
    """Upstream events decoded from an httpx streaming response.

    ``data: [DONE]`` (OpenAI) ends the stream; so does the end of the body.
    """

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_bytes()
        self._decoder = SSEDecoder()
        self._pending: collections.deque[ServerSentEvent] = collections.deque()
        self._ended = False

    async def next_event(self) -> dict[str, Any] | None:
        """The next event's JSON (a checkpoint when it has to read).

        Raises:
            ProviderTimeout: no chunk within the stream timeout.
            ProviderConnectError: the connection broke mid-stream.
            ProviderProtocolError: an event's data is not a JSON object.
        """
        while not self._pending:
            if self._ended:
                return None
            with map_exceptions():
                try:
                    chunk = await self._chunks.__anext__()
                except StopAsyncIteration:
                    self._ended = True
                    self._pending.extend(self._decoder.close())
                    continue
            self._pending.extend(self._decoder.feed(chunk))
        sse = self._pending.popleft()
        if sse.data.strip() == "[DONE]":
            self._ended = True
            self._pending.clear()
            return None
        try:
            value = orjson.loads(sse.data)
        except orjson.JSONDecodeError as exc:
            raise ProviderProtocolError(
                f"upstream stream event is not JSON: {sse.data[:200]!r}"
            ) from exc
        if not isinstance(value, dict):
            raise ProviderProtocolError(
                f"upstream stream event is not an object: {sse.data[:200]!r}"
            )
        return value

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if the last read already brought it (an upstream that sent
        several at once, or a gateway that fell behind); None when a read is needed, at
        [DONE], or for data that is not a JSON object (``next_event`` raises for it)."""
        if not self._pending:
            return None
        try:
            value = orjson.loads(self._pending[0].data)
        except orjson.JSONDecodeError:
            return None  # [DONE] or bad data: left for next_event
        if not isinstance(value, dict):
            return None
        self._pending.popleft()
        return value


@contextlib.asynccontextmanager
async def open_sse_response(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    timeout_s: float,
) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and yield the streaming response once its status is known good.

    Leaving the block closes the response: a body not read to its end drops the
    connection instead of returning it to the pool half-read.

    Raises:
        ProviderStatusError: the upstream answered an error status (its body attached).
        ProviderTimeout, ProviderConnectError: as :func:`map_exceptions`.
    """
    request = client.build_request(
        "POST",
        url,
        content=orjson.dumps(body),
        headers={"content-type": "application/json", "accept": "text/event-stream", **headers},
        timeout=request_timeout(timeout_s),
    )
    with map_exceptions():
        response = await client.send(request, stream=True)
    try:
        if response.status_code >= 400:
            with map_exceptions():
                content = await response.aread()
            raise upstream_status_error(response.status_code, content, headers)
        yield response
    finally:
        await response.aclose()


# --------------------------------------------------------------------------- trackers


class UsageTracker(Protocol):
    """Watches upstream events; knows the usage so far and whether the stream finished."""

    @property
    def usage(self) -> Usage: ...

    def observe(self, event: Mapping[str, Any]) -> None: ...

    def check_complete(self) -> None: ...


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
        reported = Usage.from_chat(event.get("usage"))
        if reported is not None:
            self._reported = reported
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str):
                self._output_chars += len(content)
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                for key in ("name", "arguments"):
                    if isinstance(function.get(key), str):
                        self._output_chars += len(function[key])
            if choice.get("finish_reason"):
                self._finished = True

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


# --------------------------------------------------------------------------- the stream


class StreamTranslator(Protocol):
    """Turns upstream events into client events; ``finish`` closes the client's stream."""

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]: ...

    def finish(self, usage: Usage) -> list[dict[str, Any]]: ...


class Passthrough:
    """The client speaks the upstream's API: events go through untouched."""

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [dict(event)]

    def finish(self, usage: Usage) -> list[dict[str, Any]]:
        return []


class Chain:
    """Two translators in a row (e.g. Anthropic events -> chat chunks -> Responses events)."""

    def __init__(self, first: StreamTranslator, second: StreamTranslator) -> None:
        self._first, self._second = first, second

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [out for mid in self._first.feed(event) for out in self._second.feed(mid)]

    def finish(self, usage: Usage) -> list[dict[str, Any]]:
        out = [x for mid in self._first.finish(usage) for x in self._second.feed(mid)]
        return out + self._second.finish(usage)


class TranslatedStream:
    """The ProviderStream of every provider: source -> tracker -> translator.

    Each step of the iteration is a checkpoint. The stream does not own the upstream
    response; the provider's context manager does.
    """

    def __init__(
        self, source: EventSource, tracker: UsageTracker, translator: StreamTranslator
    ) -> None:
        self._source = source
        self._tracker = tracker
        self._translator = translator
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._done = False
        self._error: ProviderProtocolError | None = None  # found by next_nowait

    @property
    def usage(self) -> Usage:
        """Reported usage once the upstream sent it; else counted so far."""
        return self._tracker.usage

    def __aiter__(self) -> TranslatedStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        # Always a checkpoint, even when the next event is already buffered: a consumer
        # looping over a burst of events stays cancellable and lets other tasks run.
        await trio.lowlevel.checkpoint()
        while not self._pending:
            if self._error is not None:
                raise self._error
            if self._done:
                raise StopAsyncIteration
            event = await self._source.next_event()
            try:
                if event is None:
                    self._done = True
                    self._tracker.check_complete()
                    self._pending.extend(self._translator.finish(self._tracker.usage))
                else:
                    self._tracker.observe(event)
                    self._pending.extend(self._translator.feed(event))
            except SHAPE_ERRORS as exc:
                self._done = True
                raise ProviderProtocolError(
                    f"upstream stream event has an unexpected shape: {exc!r}"
                ) from exc
        return self._pending.popleft()

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if it needs no read (a burst the upstream's last read brought),
        so that the caller can forward a burst in one write; None otherwise, and then
        ``__anext__`` reads, finishes or raises (a shape error found here included). Not
        a checkpoint; never raises."""
        while not self._pending:
            if self._done or self._error is not None:
                return None
            event = self._source.next_nowait()
            if event is None:
                return None
            try:
                self._tracker.observe(event)
                self._pending.extend(self._translator.feed(event))
            except SHAPE_ERRORS as exc:
                self._done = True
                self._error = ProviderProtocolError(
                    f"upstream stream event has an unexpected shape: {exc!r}"
                )
                self._error.__cause__ = exc
                return None
        return self._pending.popleft()


def check_streamable(api: Api) -> None:
    """Raise ValueError for an API that has no streamed form (embeddings)."""
    if api == "embeddings":
        raise ValueError("embeddings cannot be streamed")


@contextlib.asynccontextmanager
async def open_hub_stream(
    client: httpx.AsyncClient,
    hub: Hub,
    api: Api,
    body: Mapping[str, Any],
    deployment: Deployment,
    *,
    url: str,
    headers: Mapping[str, str],
    created_s: int,
) -> AsyncIterator[TranslatedStream]:
    """A streamed call through an upstream speaking ``hub``.

    Entering sends the request and checks the status (a checkpoint); leaving closes the
    upstream response, also when the client went away halfway.

    Raises:
        ProviderError: on entering (status, connect, timeout) or while iterating.
    """
    check_streamable(api)
    request = upstream_body(hub.request(api, body, stream=True), deployment)
    input_tokens = estimate_input_tokens(api, body)
    async with open_sse_response(
        client, url, headers=headers, body=request, timeout_s=deployment.stream_timeout_s
    ) as response:
        yield TranslatedStream(
            SSESource(response),
            hub.tracker(input_tokens=input_tokens),
            hub.translator(api, request=body, input_tokens=input_tokens, created_s=created_s),
        )
