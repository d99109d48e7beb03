"""OpenAI and Anthropic providers against the fake upstream over real HTTP on 127.0.0.1.

Every answer is also validated with the official SDKs' own models (pydantic), and the
SDKs themselves are pointed at the fake: proof that it speaks the real protocols.
"""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pydantic
import pytest
import trio
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from tests.unit.providers.helpers import STREAM_TEXT, completion_text, make_deployment
from triogate.errors import (
    ProviderConnectError,
    ProviderStatusError,
    ProviderTimeout,
)
from triogate.providers import new_upstream_client
from triogate.providers.anthropic import AnthropicProvider
from triogate.providers.openai import OpenAIProvider
from triogate.providers.records import Usage
from triogate.providers.tokens import count_output_tokens, estimate_input_tokens
from triogate.testing.fakeupstream import FakeUpstream, open_fake_upstream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.integration

KEY = "sk-integration-key"
PROMPT = "please tell me about the weather in Lisbon today and tomorrow"
BODIES: dict[str, dict[str, Any]] = {
    "chat": {
        "model": "group-a",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": PROMPT},
        ],
    },
    "messages": {
        "model": "group-a",
        "max_tokens": 200,
        "system": "be brief",
        "messages": [{"role": "user", "content": PROMPT}],
    },
    "responses": {"model": "group-a", "instructions": "be brief", "input": PROMPT},
}
EVENT_MODELS: dict[str, Any] = {
    "chat": pydantic.TypeAdapter(ChatCompletionChunk),
    "messages": pydantic.TypeAdapter(RawMessageStreamEvent),
    "responses": pydantic.TypeAdapter(ResponseStreamEvent),
}
BODY_MODELS: dict[str, Any] = {"chat": ChatCompletion, "messages": Message, "responses": Response}


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with open_fake_upstream() as fake:
        yield fake


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with new_upstream_client(max_connections=10) as c:
        yield c


def setup(
    kind: str, upstream: FakeUpstream, client: httpx.AsyncClient, **kw: Any
) -> tuple[Any, Any]:
    """(provider, deployment) of ``kind`` pointing at the fake."""
    if kind == "openai":
        p: Any = OpenAIProvider(client)
        base = upstream.base_url + "/v1"
    else:
        p = AnthropicProvider(client)
        base = upstream.base_url
    return p, make_deployment(kind, api_base=base, api_key=kw.pop("api_key", KEY), **kw)


async def reported_usage(upstream: FakeUpstream) -> Usage:
    """What the fake reports for the last body it received, asked again directly."""
    last = upstream.requests[-1]
    body = {k: v for k, v in last.json.items() if k not in ("stream", "stream_options")}
    headers = {
        k: v
        for k, v in last.headers.items()
        if k in ("authorization", "x-api-key", "anthropic-version")
    }
    async with httpx.AsyncClient() as raw:
        reply = (await raw.post(upstream.base_url + last.path, json=body, headers=headers)).json()
    usage = (
        Usage.from_chat(reply["usage"])
        if "choices" in reply
        else Usage.from_messages(reply["usage"])
    )
    assert usage is not None
    return usage


# --------------------------------------------------------------------------- every API


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_complete_every_api(
    kind: str, api: str, upstream: FakeUpstream, client: httpx.AsyncClient
) -> None:
    p, d = setup(kind, upstream, client)
    with trio.fail_after(10):
        completion = await p.complete(api, BODIES[api], d)
        sent = upstream.requests[-1]
        assert sent.json["model"] == "up-model"
        if kind == "openai":
            assert (
                sent.path == "/v1/chat/completions"
                and sent.headers["authorization"] == f"Bearer {KEY}"
            )
        else:
            assert sent.path == "/v1/messages" and sent.headers["x-api-key"] == KEY
            assert sent.json["max_tokens"] == BODIES[api].get("max_tokens", 4096)
        assert completion.usage == await reported_usage(upstream)
    assert completion.usage.reported
    assert completion.usage != Usage(
        input_tokens=estimate_input_tokens(api, BODIES[api]),
        output_tokens=completion.usage.output_tokens,
    )
    BODY_MODELS[api].model_validate(completion.body)
    assert completion_text(api, completion.body) == f"Fake reply from up-model. You said: {PROMPT}"


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_stream_every_api(
    kind: str, api: str, upstream: FakeUpstream, client: httpx.AsyncClient
) -> None:
    p, d = setup(kind, upstream, client)
    with trio.fail_after(10):
        async with p.stream(api, {**BODIES[api], "stream": True}, d) as stream:
            events = [e async for e in stream]
        assert stream.usage == await reported_usage(upstream)
    assert stream.usage.reported
    for event in events:
        if event.get("type") != "ping":  # Anthropic's keep-alive; the SDK skips it
            EVENT_MODELS[api].validate_python(event)
    assert STREAM_TEXT[api](events) == f"Fake reply from up-model. You said: {PROMPT}"
    usage = stream.usage
    if api == "chat":
        assert events[-1]["usage"] == usage.to_chat()
    elif api == "messages":
        assert [e["type"] for e in events][-2:] == ["message_delta", "message_stop"]
        assert events[-2]["usage"]["output_tokens"] == usage.output_tokens
    else:
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["usage"]["input_tokens"] == usage.input_tokens


async def test_openai_embeddings(upstream: FakeUpstream, client: httpx.AsyncClient) -> None:
    p, d = setup("openai", upstream, client)
    with trio.fail_after(10):
        completion = await p.complete("embeddings", {"model": "g", "input": ["a b c", "d e"]}, d)
    assert upstream.requests[-1].path == "/v1/embeddings"
    assert len(completion.body["data"]) == 2
    assert completion.usage == Usage(input_tokens=5, output_tokens=0)  # the fake counts words


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_tool_calls_cross_the_translation(
    kind: str, upstream: FakeUpstream, client: httpx.AsyncClient
) -> None:
    p, d = setup(kind, upstream, client)
    # The client speaks the *other* API than the upstream.
    if kind == "openai":
        api, body = (
            "messages",
            {
                **BODIES["messages"],
                "tool_choice": {"type": "any"},
                "tools": [
                    {
                        "name": "weather",
                        "description": "forecast",
                        "input_schema": {"type": "object"},
                    }
                ],
            },
        )
    else:
        api, body = (
            "chat",
            {
                **BODIES["chat"],
                "tool_choice": "required",
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "weather", "parameters": {"type": "object"}},
                    }
                ],
            },
        )
    with trio.fail_after(10):
        completion = await p.complete(api, body, d)
        async with p.stream(api, {**body, "stream": True}, d) as stream:
            events = [e async for e in stream]
    if api == "messages":
        (block,) = completion.body["content"]
        assert block["type"] == "tool_use" and block["name"] == "weather"
        assert block["input"] == {"query": " ".join(PROMPT.split()[:12])}
        assert completion.body["stop_reason"] == "tool_use"
        partial = "".join(
            e["delta"]["partial_json"]
            for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
        )
        assert json.loads(partial) == block["input"]
    else:
        (call,) = completion.body["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "weather"
        assert completion.body["choices"][0]["finish_reason"] == "tool_calls"
        arguments = "".join(
            tc["function"].get("arguments", "")
            for e in events
            for c in e["choices"]
            for tc in c["delta"].get("tool_calls", [])
        )
        assert arguments == call["function"]["arguments"]
    for event in events:
        EVENT_MODELS[api].validate_python(event)


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("status", [429, 500, 503, 400])
async def test_upstream_error_statuses(
    kind: str, status: int, upstream: FakeUpstream, client: httpx.AsyncClient
) -> None:
    p, d = setup(kind, upstream, client)
    upstream.fail_next(2, status=status, message=f"injected {status}")
    with trio.fail_after(10):
        with pytest.raises(ProviderStatusError) as on_complete:
            await p.complete("chat", BODIES["chat"], d)
        with pytest.raises(ProviderStatusError) as on_stream:
            async with p.stream("chat", BODIES["chat"], d):
                pytest.fail("entered a failed stream")
        # and the next call works again
        assert (await p.complete("chat", BODIES["chat"], d)).usage.reported
    for info in (on_complete, on_stream):
        assert info.value.status == status and f"injected {status}" in info.value.body
        assert info.value.retryable is (status != 400)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_wrong_key_is_a_401(kind: str, client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        async with open_fake_upstream(api_key="the-right-key") as upstream:
            p, d = setup(kind, upstream, client, api_key="a-wrong-key")
            with pytest.raises(ProviderStatusError) as info:
                await p.complete("chat", BODIES["chat"], d)
    assert info.value.status == 401 and "a-wrong-key" not in str(info.value)


@pytest.mark.parametrize(("kind", "api"), [("openai", "chat"), ("anthropic", "messages")])
async def test_closing_a_stream_early_releases_the_connection(
    kind: str, api: str, upstream: FakeUpstream
) -> None:
    upstream.chunk_delay_s = 0.02
    async with new_upstream_client(max_connections=1) as one:  # a leaked connection would block
        p, d = setup(kind, upstream, one)
        with trio.fail_after(10):
            seen: list[dict[str, Any]] = []
            async with p.stream(api, BODIES[api], d) as stream:
                async for event in stream:
                    seen.append(event)
                    if len(seen) == 5:
                        break
            await upstream.wait_disconnects(1)
            upstream.chunk_delay_s = 0.0
            again = await p.complete(api, BODIES[api], d)
    assert stream.usage == Usage(
        input_tokens=estimate_input_tokens(api, BODIES[api])
        if kind == "openai"
        else again.usage.input_tokens,  # Anthropic reports input at message_start
        output_tokens=count_output_tokens(STREAM_TEXT[api](seen)),
        reported=False,
    )
    assert stream.usage.output_tokens > 0


@pytest.mark.parametrize(
    ("kind", "api"), [("openai", "chat"), ("openai", "responses"), ("anthropic", "messages")]
)
async def test_missing_stream_usage_is_counted(
    kind: str, api: str, upstream: FakeUpstream, client: httpx.AsyncClient
) -> None:
    upstream.omit_stream_usage = True
    p, d = setup(kind, upstream, client)
    with trio.fail_after(10):
        async with p.stream(api, BODIES[api], d) as stream:
            events = [e async for e in stream]
    text = STREAM_TEXT[api](events)
    assert stream.usage == Usage(
        input_tokens=estimate_input_tokens(api, BODIES[api]),
        output_tokens=count_output_tokens(text),
        reported=False,
    )
    if api == "chat":
        assert events[-1]["usage"] == stream.usage.to_chat()


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_stream_cut_midway_is_a_connect_error(
    kind: str, upstream: FakeUpstream, client: httpx.AsyncClient
) -> None:
    upstream.break_stream_after = 3
    p, d = setup(kind, upstream, client)
    with trio.fail_after(10), pytest.raises(ProviderConnectError):
        async with p.stream("chat", BODIES["chat"], d) as stream:
            async for _ in stream:
                pass


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_timeouts(kind: str, upstream: FakeUpstream, client: httpx.AsyncClient) -> None:
    p, d = setup(kind, upstream, client, timeout_s=0.2, stream_timeout_s=0.2)
    with trio.fail_after(10):
        upstream.latency_s = 1.0
        start = trio.current_time()
        with pytest.raises(ProviderTimeout):
            await p.complete("chat", BODIES["chat"], d)
        assert trio.current_time() - start < 0.9
        upstream.latency_s, upstream.chunk_delay_s = 0.0, 1.0
        with pytest.raises(ProviderTimeout):
            async with p.stream("chat", BODIES["chat"], d) as stream:
                async for _ in stream:
                    pass


async def test_connection_refused(client: httpx.AsyncClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = make_deployment("openai", api_base=f"http://127.0.0.1:{port}/v1")
    with trio.fail_after(10), pytest.raises(ProviderConnectError):
        await OpenAIProvider(client).complete("chat", BODIES["chat"], d)


# --------------------------------------------------------------------------- the fake itself


@pytest.mark.parametrize(
    ("path", "headers", "content", "status", "shape"),
    [
        ("/v1/chat/completions", {}, b"{}", 401, "openai"),
        ("/v1/messages", {"anthropic-version": "2023-06-01"}, b"{}", 401, "anthropic"),
        ("/v1/chat/completions", {"authorization": "Bearer k"}, b"{nope", 400, "openai"),
        (
            "/v1/messages",
            {"x-api-key": "k", "anthropic-version": "2023-06-01"},
            b"[]",
            400,
            "anthropic",
        ),
        (
            "/v1/messages",
            {"x-api-key": "k"},
            b'{"model": "m", "max_tokens": 5, "messages": []}',
            400,
            "anthropic",
        ),
        (
            "/v1/messages",
            {"x-api-key": "k", "anthropic-version": "2023-06-01"},
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}',
            400,
            "anthropic",
        ),
        (
            "/v1/chat/completions",
            {"authorization": "Bearer k"},
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {}}',
            400,
            "openai",
        ),
        ("/v1/embeddings", {"authorization": "Bearer k"}, b'{"model": "m"}', 400, "openai"),
        ("/v1/nowhere", {"authorization": "Bearer k"}, b"{}", 404, "openai"),
    ],
)
async def test_fake_refuses_like_the_real_apis(
    path: str,
    headers: dict[str, str],
    content: bytes,
    status: int,
    shape: str,
    upstream: FakeUpstream,
) -> None:
    with trio.fail_after(10):
        async with httpx.AsyncClient() as raw:
            reply = await raw.post(upstream.base_url + path, content=content, headers=headers)
    assert reply.status_code == status
    body = reply.json()
    if shape == "openai":
        assert set(body) == {"error"} and body["error"]["message"] and body["error"]["type"]
    else:
        assert body["type"] == "error" and body["error"]["type"].endswith("_error")


async def test_fake_latency_per_request_and_models(upstream: FakeUpstream) -> None:
    with trio.fail_after(10):
        async with httpx.AsyncClient() as raw:
            start = trio.current_time()
            reply = await raw.get(
                upstream.base_url + "/v1/models?latency_ms=200",
                headers={"authorization": "Bearer k"},
            )
            assert trio.current_time() - start >= 0.2
    assert reply.json()["data"][0]["object"] == "model"


async def test_fake_cli_serves_in_its_own_process() -> None:
    command = [sys.executable, "-m", "triogate.testing.fakeupstream",
               "--port", "0", "--latency-ms", "1"]
    run = functools.partial(trio.run_process, command, stdout=subprocess.PIPE, check=False)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            process = await nursery.start(run)
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some(100)
            base_url = line.decode().strip()
            async with httpx.AsyncClient() as raw:
                reply = await raw.get(
                    base_url + "/v1/models", headers={"authorization": "Bearer k"}
                )
            process.terminate()
    assert base_url.startswith("http://127.0.0.1:") and reply.status_code == 200


# --------------------------------------------------------------------------- official SDKs


async def test_openai_sdk_chat_against_the_fake(upstream: FakeUpstream) -> None:
    sdk = openai.AsyncOpenAI(base_url=upstream.base_url + "/v1", api_key=KEY, max_retries=0)
    messages: Any = BODIES["chat"]["messages"]
    with trio.fail_after(10):
        reply = await sdk.chat.completions.create(model="up-model", messages=messages)
        stream = await sdk.chat.completions.create(
            model="up-model", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
        upstream.fail_next(1, status=429)
        with pytest.raises(openai.RateLimitError):
            await sdk.chat.completions.create(model="up-model", messages=messages)
        embedding = await sdk.embeddings.create(model="e", input="hello world")
    assert reply.choices[0].message.content == f"Fake reply from up-model. You said: {PROMPT}"
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == reply.choices[0].message.content
    )
    assert chunks[-1].usage == reply.usage and reply.usage is not None
    assert len(embedding.data[0].embedding) == 8 and embedding.usage.prompt_tokens == 2


async def test_anthropic_sdk_messages_against_the_fake(upstream: FakeUpstream) -> None:
    sdk = anthropic.AsyncAnthropic(base_url=upstream.base_url, api_key=KEY, max_retries=0)
    messages: Any = BODIES["messages"]["messages"]
    with trio.fail_after(10):
        reply = await sdk.messages.create(
            model="up-model", max_tokens=200, system="be brief", messages=messages
        )
        async with sdk.messages.stream(
            model="up-model", max_tokens=200, system="be brief", messages=messages
        ) as s:
            text = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
        upstream.fail_next(1, status=529, message="Overloaded")
        with pytest.raises(anthropic.APIStatusError) as info:
            await sdk.messages.create(model="up-model", max_tokens=5, messages=messages)
    assert reply.content[0].type == "text"
    assert reply.content[0].text == text == f"Fake reply from up-model. You said: {PROMPT}"
    assert final.usage.output_tokens == reply.usage.output_tokens
    assert final.usage.input_tokens == reply.usage.input_tokens
    assert info.value.status_code == 529
