"""A real HTTP server that speaks the OpenAI and Anthropic APIs, for tests and benchmarks.

Raw ASGI on hypercorn's trio worker, no framework. Replies are deterministic and derived
from the prompt, usage is counted the fake's own way (words, not characters) so that
tests can tell a *reported* usage from triogate's estimate. It checks what real
upstreams check (auth headers, ``anthropic-version``, ``max_tokens``, ``stream_options``
only with ``stream``) and answers errors in each API's own shape.

In tests::

    async with open_fake_upstream() as upstream:
        upstream.fail_next(2, status=503)
        ... upstream.base_url ...   # "http://127.0.0.1:PORT"

For benchmarks, a separate process: ``python -m triogate.testing.fakeupstream --port 8099``.

Routes: ``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``POST /v1/moderations``,
``GET /v1/models``
(OpenAI: ``Authorization: Bearer``) and ``POST /v1/messages`` (Anthropic: ``x-api-key``).
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import hashlib
import math
import struct
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import attrs
import orjson
import trio

from triogate.testing.asgi import http_body, send_json, serving

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.testing.asgi import Receive, Scope, Send

#: Words of the prompt quoted in a reply.
QUOTED_WORDS = 12
#: Tokens the fake adds to every prompt (a fixed "template" overhead, like real models).
PROMPT_OVERHEAD_TOKENS = 7
EMBEDDING_DIMENSIONS = 8


class BrokenStream(Exception):
    """Raised inside the fake to cut a stream mid-body (the client sees a broken read)."""


class HTTPError(Exception):
    """Raised inside the fake to answer an error status in the route's API shape."""

    def __init__(self, status: int, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@attrs.frozen(kw_only=True)
class ReceivedRequest:
    """One request as the fake received it (headers lower-cased; json None if invalid)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    json: Any


@attrs.frozen(kw_only=True)
class Reply:
    """What the fake answers to one chat-like request, in neutral form."""

    text: str
    tool_call: tuple[str, str, str] | None  # (id, name, arguments JSON)
    finish: str  # "stop" | "length" | "tool_calls"
    input_tokens: int
    output_tokens: int


# --------------------------------------------------------------------------- replies


def _words(value: Any) -> list[str]:
    """Every word of every text in a message list / system value / content."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [w for item in value for w in _words(item)]
    if isinstance(value, dict):
        out: list[str] = []
        for key in ("content", "text", "arguments", "input"):
            if key in value:
                item = value[key]
                out += _words(item if not isinstance(item, dict) else orjson.dumps(item).decode())
        for call in value.get("tool_calls") or ():
            out += _words(call.get("function"))
        return out
    return []


def _last_user_words(messages: list[Any]) -> list[str]:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _words(message.get("content"))
    return []


def make_reply(
    *, model: str, messages: list[Any], system: Any, max_tokens: int | None, tool: str | None
) -> Reply:
    """The deterministic reply: counted in words (each word one token)."""
    prompt_words = _last_user_words(messages)
    input_tokens = PROMPT_OVERHEAD_TOKENS + len(_words(messages)) + len(_words(system))
    quoted = " ".join(prompt_words[:QUOTED_WORDS])
    if tool is not None:
        arguments = orjson.dumps({"query": quoted}).decode()
        call_id = "call_" + hashlib.sha256(arguments.encode()).hexdigest()[:12]
        output = len(arguments.split()) + 1
        return Reply(
            text="",
            tool_call=(call_id, tool, arguments),
            finish="tool_calls",
            input_tokens=input_tokens,
            output_tokens=output,
        )
    words = f"Fake reply from {model}. You said: {quoted}".split()
    finish = "stop"
    if max_tokens is not None and len(words) > max_tokens:
        words, finish = words[:max_tokens], "length"
    return Reply(
        text=" ".join(words),
        tool_call=None,
        finish=finish,
        input_tokens=input_tokens,
        output_tokens=len(words),
    )


def _text_pieces(text: str) -> list[str]:
    """Stream pieces: one per word, the space kept in front (joins back to ``text``)."""
    words = text.split(" ")
    return [words[0]] + [" " + w for w in words[1:]] if text else []


def _embedding(text: str, dimensions: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    raw = [(digest[i % len(digest)] - 127.5) / 127.5 for i in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]


# --------------------------------------------------------------------------- the server


@attrs.define(eq=False, kw_only=True)
class FakeUpstream:
    """The fake's state and controls; it is also the ASGI app.

    Attributes:
        base_url: "http://HOST:PORT" once serving.
        latency_s: added before every answer (a request may override it with the query
            parameter ``latency_ms`` or the header ``x-fake-latency-ms``).
        chunk_delay_s: pause between streamed events.
        omit_stream_usage: never send usage in streams (as some servers do).
        break_stream_after: cut every stream after this many events (no clean end).
        api_key: if set, the only key accepted; else any non-empty key is.
        requests: every request received, in order (unless ``record_requests`` is off,
            as in the benchmark CLI, where it would only grow).
        disconnects: streams whose client went away before the end.
    """

    base_url: str = ""
    latency_s: float = 0.0
    chunk_delay_s: float = 0.0
    omit_stream_usage: bool = False
    break_stream_after: int | None = None
    api_key: str | None = None
    record_requests: bool = True
    requests: list[ReceivedRequest] = attrs.Factory(list)
    disconnects: int = 0
    _failures: collections.deque[tuple[int, str]] = attrs.Factory(collections.deque)
    _changed: trio.Event = attrs.Factory(trio.Event)

    def fail_next(
        self, n: int = 1, status: int = 500, *, message: str = "injected failure"
    ) -> None:
        """Answer the next ``n`` API requests with ``status`` (in the route's error shape)."""
        self._failures.extend([(status, message)] * n)

    async def wait_disconnects(self, count: int) -> None:
        """Wait until ``count`` streams in total have seen their client go away."""
        while self.disconnects < count:
            await self._changed.wait()

    def _note_disconnect(self) -> None:
        self.disconnects += 1
        self._changed.set()
        self._changed = trio.Event()

    # ----------------------------------------------------------------- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (body := await http_body(scope, receive, send)) is None:
            return
        path = scope["path"]
        anthropic = path.startswith("/v1/messages")
        try:
            await self._handle(scope, body, receive, send)
        except HTTPError as error:
            await _send_error(send, error, anthropic=anthropic)

    async def _handle(self, scope: Scope, raw: bytes, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        method, path = scope["method"], scope["path"]
        if self.record_requests:
            self.requests.append(
                ReceivedRequest(method=method, path=path, query=query, headers=headers, json=body)
            )
        routes = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("POST", "/v1/moderations"): self._moderations,
            ("GET", "/v1/models"): self._models,
            ("POST", "/v1/messages"): self._messages,
        }
        handler = routes.get((method, path))
        if handler is None:
            raise HTTPError(404, f"no route {method} {path}", kind="not_found_error")
        auth = headers.get("authorization", "")
        bearer = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
        if path == "/v1/messages":
            # Anthropic takes x-api-key; its newer SDKs send the key as a Bearer token.
            key = headers.get("x-api-key") or bearer
            if not key or (self.api_key is not None and key != self.api_key):
                raise HTTPError(401, "invalid x-api-key", kind="authentication_error")
            if not headers.get("anthropic-version"):
                raise HTTPError(400, "anthropic-version header is required")
        elif not bearer or (self.api_key is not None and bearer != self.api_key):
            raise HTTPError(401, "Incorrect API key provided", kind="invalid_api_key")
        if method == "POST" and not isinstance(body, dict):
            raise HTTPError(400, "the request body is not a JSON object")
        latency_ms = query.get("latency_ms") or headers.get("x-fake-latency-ms")
        await trio.sleep(float(latency_ms) / 1000 if latency_ms else self.latency_s)
        if self._failures and method == "POST":
            status, message = self._failures.popleft()
            raise HTTPError(status, message)
        await handler(body or {}, receive, send)

    # ----------------------------------------------------------------- OpenAI

    async def _models(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        models = [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "triogate"}]
        await send_json(send, 200, {"object": "list", "data": models})

    async def _chat(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        model, messages = body.get("model"), body.get("messages")
        if not isinstance(model, str) or not model:
            raise HTTPError(400, "you must provide a model parameter")
        if not isinstance(messages, list) or not messages:
            raise HTTPError(400, "messages must be a non-empty array")
        if not all(isinstance(m, dict) and m.get("role") for m in messages):
            raise HTTPError(400, "every message needs a role")
        stream = bool(body.get("stream"))
        if body.get("stream_options") is not None and not stream:
            raise HTTPError(
                400, "The 'stream_options' parameter is only allowed when 'stream' is enabled."
            )
        choice = body.get("tool_choice")
        tools = body.get("tools") or []
        tool = None
        if tools and (choice == "required" or isinstance(choice, dict)):
            named = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
            tool = named or tools[0]["function"]["name"]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        reply = make_reply(
            model=model, messages=messages, system=None, max_tokens=max_tokens, tool=tool
        )
        ident = "chatcmpl-" + hashlib.sha256(orjson.dumps(body)).hexdigest()[:16]
        usage = {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        }
        calls: list[dict[str, Any]] = []
        if reply.tool_call is not None:
            call_id, name, arguments = reply.tool_call
            calls = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ]
        if not stream:
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
            if calls:
                message["tool_calls"] = calls
            await send_json(
                send,
                200,
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": reply.finish,
                            "logprobs": None,
                        }
                    ],
                    "usage": usage,
                },
            )
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        include_usage = include_usage and not self.omit_stream_usage
        base = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
        }
        if include_usage:
            base["usage"] = None

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in _text_pieces(reply.text)]
        if calls:
            call = calls[0]
            start = {
                "index": 0,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            events.append(chunk({"tool_calls": [start]}))
            for piece in _text_pieces(call["function"]["arguments"]):
                events.append(
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                )
        events.append(chunk({}, reply.finish))
        if include_usage:
            events.append(
                b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
            )
        events.append(b"data: [DONE]\n\n")
        await self._stream(send, receive, events)

    async def _embeddings(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        model, value = body.get("model"), body.get("input")
        if not isinstance(model, str) or not model:
            raise HTTPError(400, "you must provide a model parameter")
        if isinstance(value, str):
            inputs = [value]
        elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            inputs = [" ".join(map(str, value))]
        elif isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
            inputs = [v if isinstance(v, str) else " ".join(map(str, v)) for v in value]
        else:
            raise HTTPError(400, "'input' must be a string or an array of strings")
        dimensions = body.get("dimensions") or EMBEDDING_DIMENSIONS
        data = []
        for index, text in enumerate(inputs):
            vector = _embedding(f"{model}\0{text}", dimensions)
            embedding: Any = vector
            if body.get("encoding_format") == "base64":
                embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        tokens = sum(len(text.split()) for text in inputs)
        await send_json(
            send,
            200,
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    async def _moderations(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        """OpenAI's moderation shape: an input is flagged (``violence``) when it holds
        the word "kill"; scores are deterministic."""
        value = body.get("input")
        inputs = [value] if isinstance(value, str) else value
        if not isinstance(inputs, list) or not inputs or not all(
                isinstance(v, str) for v in inputs):
            raise HTTPError(400, "'input' must be a string or an array of strings")
        results = []
        for text in inputs:
            flagged = "kill" in text.lower().split()
            results.append({
                "flagged": flagged,
                "categories": {"violence": flagged, "hate": False, "sexual": False},
                "category_scores": {"violence": 0.97 if flagged else 0.01, "hate": 0.0,
                                    "sexual": 0.0},
            })
        await send_json(send, 200, {"id": f"modr-{len(self.requests)}",
                                     "model": body.get("model") or "omni-moderation-latest",
                                     "results": results})

    # ----------------------------------------------------------------- Anthropic

    async def _messages(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        model, messages, max_tokens = (
            body.get("model"),
            body.get("messages"),
            body.get("max_tokens"),
        )
        if not isinstance(model, str) or not model:
            raise HTTPError(400, "model: Field required")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise HTTPError(400, "max_tokens: Field required")
        if not isinstance(messages, list) or not messages:
            raise HTTPError(400, "messages: at least one message is required")
        for message in messages:
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise HTTPError(400, "messages: roles must be 'user' or 'assistant'")
        choice = body.get("tool_choice") or {}
        tools = body.get("tools") or []
        tool = None
        if tools and choice.get("type") in ("any", "tool"):
            tool = choice.get("name") or tools[0]["name"]
        reply = make_reply(
            model=model,
            messages=messages,
            system=body.get("system"),
            max_tokens=max_tokens,
            tool=tool,
        )
        ident = "msg_" + hashlib.sha256(orjson.dumps(body)).hexdigest()[:16]
        stop_reason = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[
            reply.finish
        ]
        content: list[dict[str, Any]] = []
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        if reply.tool_call is not None:
            call_id, name, arguments = reply.tool_call
            content.append(
                {
                    "type": "tool_use",
                    "id": "toolu_" + call_id[5:],
                    "name": name,
                    "input": orjson.loads(arguments),
                }
            )
        usage = {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens}
        message = {
            "id": ident,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            await send_json(send, 200, message)
            return

        def event(data: dict[str, Any]) -> bytes:
            kind = str(data["type"]).encode()
            return b"event: " + kind + b"\ndata: " + orjson.dumps(data) + b"\n\n"

        start = {**message, "content": [], "stop_reason": None}
        if self.omit_stream_usage:
            del start["usage"]
        else:
            start["usage"] = {"input_tokens": reply.input_tokens, "output_tokens": 1}
        events = [event({"type": "message_start", "message": start}), event({"type": "ping"})]
        for index, block in enumerate(content):
            if block["type"] == "text":
                events.append(
                    event(
                        {
                            "type": "content_block_start",
                            "index": index,
                            "content_block": {"type": "text", "text": ""},
                        }
                    )
                )
                for piece in _text_pieces(block["text"]):
                    events.append(
                        event(
                            {
                                "type": "content_block_delta",
                                "index": index,
                                "delta": {"type": "text_delta", "text": piece},
                            }
                        )
                    )
            else:
                events.append(
                    event(
                        {
                            "type": "content_block_start",
                            "index": index,
                            "content_block": {**block, "input": {}},
                        }
                    )
                )
                for piece in _text_pieces(orjson.dumps(block["input"]).decode()):
                    events.append(
                        event(
                            {
                                "type": "content_block_delta",
                                "index": index,
                                "delta": {"type": "input_json_delta", "partial_json": piece},
                            }
                        )
                    )
            events.append(event({"type": "content_block_stop", "index": index}))
        delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        }
        if not self.omit_stream_usage:
            delta["usage"] = {"output_tokens": reply.output_tokens}
        events += [event(delta), event({"type": "message_stop"})]
        await self._stream(send, receive, events)

    # ----------------------------------------------------------------- streaming

    async def _stream(self, send: Send, receive: Receive, events: list[bytes]) -> None:
        """Send SSE ``events``; notice a client that goes away (counted in disconnects)."""
        finished = False

        async def watch_disconnect(cancel: trio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not finished:
                self._note_disconnect()
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, nursery.cancel_scope)
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream"),
                        (b"cache-control", b"no-cache"),
                    ],
                }
            )
            for count, data in enumerate(events):
                if self.break_stream_after is not None and count >= self.break_stream_after:
                    raise BrokenStream("stream cut on purpose (break_stream_after)")
                if count and self.chunk_delay_s:
                    await trio.sleep(self.chunk_delay_s)
                await send({"type": "http.response.body", "body": data, "more_body": True})
            finished = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


async def _send_error(send: Send, error: HTTPError, *, anthropic: bool) -> None:
    """An error in the route's API shape (Anthropic's or OpenAI's)."""
    headers = [(b"retry-after", b"1")] if error.status == 429 else []
    if anthropic:
        kind = error.kind if error.kind and error.kind.endswith("_error") else None
        kind = kind or _ANTHROPIC_TYPES.get(error.status, "api_error")
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": error.message}}
    else:
        kind = _OPENAI_TYPES.get(error.status, "server_error")
        code = error.kind if error.kind and not error.kind.endswith("_error") else None
        body = {"error": {"message": error.message, "type": kind, "param": None, "code": code}}
    await send_json(send, error.status, body, headers)


# --------------------------------------------------------------------------- running


@contextlib.asynccontextmanager
async def open_fake_upstream(
    host: str = "127.0.0.1", port: int = 0, **settings: Any
) -> AsyncIterator[FakeUpstream]:
    """Serve a :class:`FakeUpstream` in a nursery of the caller's task; stop on exit.

    Args:
        host, port: where to listen (port 0: any free port; see ``base_url``).
        settings: initial attributes (``latency_s``, ``api_key``, ...).
    """
    async with serving(FakeUpstream(**settings), host, port) as upstream:
        yield upstream


def main(argv: list[str] | None = None) -> None:
    """``python -m triogate.testing.fakeupstream --port N [--latency-ms X]``: serve until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0)
    parser.add_argument("--api-key", default=None, help="the only key accepted (default: any)")
    args = parser.parse_args(argv)

    async def run() -> None:
        async with open_fake_upstream(
            args.host,
            args.port,
            latency_s=args.latency_ms / 1000,
            chunk_delay_s=args.chunk_delay_ms / 1000,
            api_key=args.api_key,
            record_requests=False,
        ) as upstream:
            print(upstream.base_url, flush=True)
            await trio.sleep_forever()

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)
    sys.exit(0)


if __name__ == "__main__":
    main()
