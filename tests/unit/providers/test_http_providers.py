"""OpenAI and Anthropic providers against httpx.MockTransport: requests sent, errors mapped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import orjson
import pytest
import trio
import trio.lowlevel

from triogate.errors import (
    ProviderConnectError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
)
from triogate.providers.anthropic import AnthropicProvider
from triogate.providers.openai import OpenAIProvider
from triogate.providers.records import Usage
from triogate.providers.tokens import count_output_tokens, estimate_input_tokens

from .helpers import make_deployment

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio.testing import MockClock

KEY = "sk-SECRET-0123456789"
CHAT = {
    "model": "group-a",
    "messages": [{"role": "user", "content": "hello there"}],
    "mock_response": "ignored by real providers",
}
CHAT_REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "up-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi!"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
}
MESSAGE_REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "up-model",
    "content": [{"type": "text", "text": "hi!"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 3},
}


def provider(kind: str, handler: Any) -> Any:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return (OpenAIProvider if kind == "openai" else AnthropicProvider)(client, clock=lambda: 1000.0)


def deployment(kind: str, **kw: Any):  # type: ignore[no-untyped-def]
    base = "http://upstream.test/v1" if kind == "openai" else "http://upstream.test"
    return make_deployment(kind, api_base=kw.pop("api_base", base), api_key=KEY, **kw)


class Body(httpx.AsyncByteStream):
    """A streamed body: the given chunks, then optionally an error; records aclose."""

    def __init__(self, chunks: list[bytes], *, error: Exception | None = None) -> None:
        self.chunks, self.error, self.closed = chunks, error, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            await trio.lowlevel.checkpoint()
            yield chunk
        if self.error is not None:
            raise self.error

    async def aclose(self) -> None:
        self.closed = True


def sse(*events: dict[str, Any], done: bool = True) -> list[bytes]:
    out = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events]
    return out + ([b"data: [DONE]\n\n"] if done else [])


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-9",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


# --------------------------------------------------------------------------- requests sent


async def test_openai_request_is_native_chat_with_the_deployment_model() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=CHAT_REPLY)

    completion = await provider("openai", handler).complete("chat", CHAT, deployment("openai"))
    (request,) = seen
    assert str(request.url) == "http://upstream.test/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    body = orjson.loads(request.content)
    assert body == {"model": "up-model", "messages": CHAT["messages"]}
    assert completion.usage == Usage(input_tokens=12, output_tokens=3)
    assert completion.body["choices"][0]["message"]["content"] == "hi!"


async def test_openai_stream_always_asks_for_usage() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(request.content))
        return httpx.Response(200, stream=Body(sse(chunk({"content": "x"}, "stop"))))

    body = {**CHAT, "stream": True}  # the client did not ask for usage
    async with provider("openai", handler).stream("chat", body, deployment("openai")) as stream:
        events = [e async for e in stream]
    assert seen[0]["stream"] is True and seen[0]["stream_options"] == {"include_usage": True}
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 1


async def test_anthropic_request_headers_and_translation() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=MESSAGE_REPLY)

    completion = await provider("anthropic", handler).complete(
        "chat", CHAT, deployment("anthropic")
    )
    (request,) = seen
    assert str(request.url) == "http://upstream.test/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert orjson.loads(request.content) == {
        "model": "up-model",
        "messages": CHAT["messages"],
        "max_tokens": 4096,
    }
    assert completion.body["object"] == "chat.completion"
    assert completion.body["created"] == 1000
    assert completion.body["usage"] == {
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "total_tokens": 15,
    }


@pytest.mark.parametrize(
    ("kind", "url"),
    [
        ("openai", "https://api.openai.com/v1/chat/completions"),
        ("anthropic", "https://api.anthropic.com/v1/messages"),
    ],
)
async def test_default_api_base(kind: str, url: str) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json=CHAT_REPLY if kind == "openai" else MESSAGE_REPLY)

    await provider(kind, handler).complete("chat", CHAT, deployment(kind, api_base=None))
    assert seen == [url]


async def test_missing_usage_is_counted() -> None:
    reply = {k: v for k, v in CHAT_REPLY.items() if k != "usage"}
    completion = await provider("openai", lambda r: httpx.Response(200, json=reply)).complete(
        "messages",
        {"model": "g", "max_tokens": 5, "messages": [{"role": "user", "content": "hello"}]},
        deployment("openai"),
    )
    expected = Usage(input_tokens=2, output_tokens=count_output_tokens("hi!"), reported=False)
    assert completion.usage == expected
    assert completion.body["usage"] == {"input_tokens": 2, "output_tokens": 1}


# --------------------------------------------------------------------------- errors


def raising(exc: Exception) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


ERRORS = [
    (raising(httpx.ConnectError("connection refused")), ProviderConnectError),
    (raising(httpx.ConnectTimeout("connect timed out")), ProviderTimeout),
    (raising(httpx.ReadTimeout("read timed out")), ProviderTimeout),
    (raising(httpx.RemoteProtocolError("server disconnected")), ProviderConnectError),
    (raising(httpx.ReadError("connection reset")), ProviderConnectError),
    (lambda r: httpx.Response(429, json={"error": {"message": "slow down"}}), ProviderStatusError),
    (lambda r: httpx.Response(500, text="upstream exploded"), ProviderStatusError),
]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize(("handler", "error"), ERRORS)
async def test_errors_map_to_provider_errors(
    kind: str, handler: Any, error: type[Exception]
) -> None:
    p, d = provider(kind, handler), deployment(kind)
    with pytest.raises(error) as on_complete:
        await p.complete("chat", CHAT, d)
    with pytest.raises(error) as on_stream:
        async with p.stream("chat", CHAT, d) as stream:
            async for _ in stream:
                pass
    for info in (on_complete, on_stream):
        assert info.value.__cause__ is not None or isinstance(info.value, ProviderStatusError)
        assert KEY not in str(info.value)


@pytest.mark.parametrize(
    ("status", "text", "retryable"),
    [
        (429, "slow down", True),
        (500, "exploded", True),
        (503, "overloaded", True),
        (400, "bad request", False),
        (404, "no such model", False),
    ],
)
async def test_status_errors_keep_the_upstream_message(
    status: int, text: str, retryable: bool
) -> None:
    handler = lambda r: httpx.Response(status, json={"error": {"message": text}})  # noqa: E731
    with pytest.raises(ProviderStatusError) as info:
        await provider("openai", handler).complete("chat", CHAT, deployment("openai"))
    assert info.value.status == status and text in info.value.body and text in str(info.value)
    assert info.value.retryable is retryable


async def test_a_key_echoed_by_the_upstream_is_blanked() -> None:
    handler = lambda r: httpx.Response(401, json={"error": {"message": f"bad key {KEY}"}})  # noqa: E731
    for kind in ("openai", "anthropic"):
        with pytest.raises(ProviderStatusError) as info:
            await provider(kind, handler).complete("chat", CHAT, deployment(kind))
        assert KEY not in info.value.body and KEY not in str(info.value)
        assert "bad key ***" in info.value.body


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, text="<html>not json</html>"),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json={"choices": "not a list"}),
    ],
)
async def test_unparseable_replies_are_protocol_errors(response: httpx.Response) -> None:
    with pytest.raises(ProviderProtocolError):
        await provider("openai", lambda r: response).complete(
            "messages",
            {"model": "g", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
            deployment("openai"),
        )


async def test_the_whole_call_has_a_deadline(autojump_clock: MockClock) -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await trio.sleep(100)
        return httpx.Response(200, json=CHAT_REPLY)

    start = trio.current_time()
    with pytest.raises(ProviderTimeout):
        await provider("openai", slow).complete("chat", CHAT, deployment("openai", timeout_s=2.5))
    assert trio.current_time() - start == 2.5


async def test_anthropic_has_no_embeddings() -> None:
    with pytest.raises(ProviderStatusError) as info:
        await provider("anthropic", raising(AssertionError("no call"))).complete(
            "embeddings", {"model": "g", "input": "x"}, deployment("anthropic")
        )
    assert info.value.status == 400 and "embeddings" in info.value.body
    for kind in ("openai", "anthropic"):
        with pytest.raises(ValueError, match="embeddings"):
            provider(kind, raising(AssertionError("no call"))).stream(
                "embeddings", {"input": "x"}, deployment(kind)
            )


# --------------------------------------------------------------------------- streams


async def collect(
    kind: str, body_stream: Body, api: str = "chat"
) -> tuple[list[dict[str, Any]], Any]:
    p = provider(kind, lambda r: httpx.Response(200, stream=body_stream))
    body = (
        CHAT
        if api == "chat"
        else {"model": "g", "max_tokens": 5, "messages": [{"role": "user", "content": "hello"}]}
    )
    events: list[dict[str, Any]] = []
    async with p.stream(api, body, deployment(kind)) as stream:
        async for event in stream:
            events.append(event)
    return events, stream


@pytest.mark.parametrize(
    ("kind", "body", "error"),
    [
        (
            "openai",
            Body(sse(chunk({"content": "a"}), done=False), error=httpx.ReadError("reset")),
            ProviderConnectError,
        ),
        ("openai", Body([b"data: {not json}\n\n"]), ProviderProtocolError),
        ("openai", Body([b"data: [1]\n\n"]), ProviderProtocolError),
        ("openai", Body(sse(chunk({"content": "a"}), done=False)), ProviderProtocolError),
        ("openai", Body(sse({"error": {"message": "boom"}})), ProviderStatusError),
        ("openai", Body(sse({"id": "x", "choices": "wrong"})), ProviderProtocolError),
        (
            "anthropic",
            Body(
                [b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\n'],
                error=httpx.RemoteProtocolError("incomplete chunked read"),
            ),
            ProviderConnectError,
        ),
        (
            "anthropic",
            Body([b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\n']),
            ProviderProtocolError,
        ),
    ],
)
async def test_broken_streams(kind: str, body: Body, error: type[Exception]) -> None:
    with pytest.raises(error):
        await collect(kind, body)
    assert body.closed


async def test_anthropic_error_event_keeps_its_status() -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    body = Body([b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"])
    with pytest.raises(ProviderStatusError) as info:
        await collect("anthropic", body, api="messages")
    assert info.value.status == 529 and "Overloaded" in info.value.body


async def test_stream_error_status_raises_on_entering() -> None:
    p = provider("openai", lambda r: httpx.Response(503, text="try later"))
    with pytest.raises(ProviderStatusError) as info:
        async with p.stream("chat", CHAT, deployment("openai")):
            pytest.fail("entered")
    assert info.value.status == 503 and info.value.body == "try later"


async def test_leaving_early_closes_the_upstream_and_keeps_partial_usage() -> None:
    body = Body(sse(*[chunk({"content": "word "}) for _ in range(50)], chunk({}, "stop")))
    p = provider("openai", lambda r: httpx.Response(200, stream=body))
    async with p.stream("chat", CHAT, deployment("openai")) as stream:
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 4:
                break
    assert body.closed
    assert stream.usage == Usage(
        input_tokens=estimate_input_tokens("chat", CHAT),
        output_tokens=count_output_tokens("word " * 4),
        reported=False,
    )


async def test_stream_without_usage_is_counted_and_the_usage_chunk_added() -> None:
    body = Body(
        sse(
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hello there"}),
            chunk({}, "stop"),
        )
    )
    events, stream = await collect("openai", body)
    usage = Usage(
        input_tokens=estimate_input_tokens("chat", CHAT),
        output_tokens=count_output_tokens("Hello there"),
        reported=False,
    )
    assert stream.usage == usage
    assert events[-1]["choices"] == [] and events[-1]["usage"] == usage.to_chat()
    assert events[-1]["id"] == "chatcmpl-9"


async def test_anthropic_stream_reports_usage_from_its_events() -> None:
    events = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "model": "m",
                "usage": {"input_tokens": 40, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]
    raw = [
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    ]
    out, stream = await collect("anthropic", Body(raw))
    assert stream.usage == Usage(input_tokens=40, output_tokens=9)
    assert out[-1]["usage"] == {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49}
    assert [c["choices"][0]["finish_reason"] for c in out[:-1]] == [None, None, "stop"]


async def test_native_usage_reaches_the_client_untouched() -> None:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 30, "output_tokens": 4}
    reply = {**MESSAGE_REPLY, "usage": usage}
    body = {"model": "g", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
    p = provider("anthropic", lambda r: httpx.Response(200, json=reply))
    completion = await p.complete("messages", body, deployment("anthropic"))
    assert completion.body["usage"] == usage
    assert completion.usage == Usage(input_tokens=40, output_tokens=4)  # cache reads are input


async def test_build_providers_owns_one_client_per_kind() -> None:
    from triogate.config import OPENAI_COMPATIBLE, parse_config
    from triogate.providers import build_providers
    from triogate.providers.transport import UpstreamTransport

    async with build_providers(parse_config({}), max_connections=50) as providers:
        assert set(providers) == {"openai", "anthropic", "mock", "azure", *OPENAI_COMPATIBLE,
                                  "gemini", "vertex_ai", "bedrock"}
        assert all(providers[name] is providers["openai"] for name in OPENAI_COMPATIBLE)
        clients = [providers[k]._client
                   for k in ("openai", "anthropic", "azure", "gemini", "bedrock")]
        assert len({id(c) for c in clients}) == 5
        assert providers["vertex_ai"]._client is providers["gemini"]._client  # type: ignore[attr-defined]
        assert all(not c.is_closed for c in clients)
        pool = clients[0]._transport
        assert isinstance(pool, UpstreamTransport)
        assert pool.max_connections == 50 and pool.max_keepalive_connections == 50
    assert all(c.is_closed for c in clients)
