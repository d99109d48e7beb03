"""Chat completions through the official openai SDK, against real loopback upstreams."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import BOTH_SERVERS, MASTER_KEY, UPSTREAM_KEY

if TYPE_CHECKING:
    from tests.e2e.conftest import Gateway
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e, BOTH_SERVERS]

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is structured concurrency?"}]


def client(gateway: Gateway, key: str = MASTER_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0)


async def test_async_sdk_completion_through_an_openai_upstream(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    with trio.fail_after(20):
        reply = await client(gateway).chat.completions.create(
            model="gpt-test", messages=MESSAGES, max_tokens=50)
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    sent = upstream.requests[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.json["model"] in ("gpt-up-a", "gpt-up-b")  # the group name is replaced
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"  # not the client's key


async def test_async_sdk_stream_with_usage(gateway: Gateway) -> None:
    with trio.fail_after(20):
        stream = await client(gateway).chat.completions.create(
            model="gpt-test", messages=MESSAGES, stream=True,
            stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert not chunks[-1].choices


async def test_stream_without_include_usage_has_no_usage_chunk(gateway: Gateway) -> None:
    with trio.fail_after(20):
        stream = await client(gateway).chat.completions.create(
            model="gpt-test", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


async def test_sync_sdk_completion_and_stream(gateway: Gateway) -> None:
    def run() -> tuple[str, str]:
        sync = openai.OpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY, max_retries=0)
        reply = sync.chat.completions.create(model="gpt-test", messages=MESSAGES)
        streamed = "".join(
            c.choices[0].delta.content or ""
            for c in sync.chat.completions.create(model="gpt-test", messages=MESSAGES,
                                                  stream=True)
            if c.choices
        )
        return reply.choices[0].message.content or "", streamed

    with trio.fail_after(30):
        text, streamed = await trio.to_thread.run_sync(run)
    assert text and streamed


async def test_chat_to_an_anthropic_upstream_is_translated(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    with trio.fail_after(20):
        reply = await client(gateway).chat.completions.create(
            model="claude-test", messages=MESSAGES, max_tokens=64)
        stream = await client(gateway).chat.completions.create(
            model="claude-test", messages=MESSAGES, max_tokens=64, stream=True,
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    anthropic_calls = [r for r in upstream.requests if r.path == "/v1/messages"]
    assert len(anthropic_calls) == 2
    assert anthropic_calls[0].json["system"]  # the system message became `system`
    assert anthropic_calls[0].headers["x-api-key"] == UPSTREAM_KEY
    assert chunks[-1].usage is not None


async def test_models_lists_the_groups(gateway: Gateway) -> None:
    with trio.fail_after(10):
        models = await client(gateway).models.list()
    assert {m.id for m in models.data} == {"gpt-test", "claude-test", "embed-test"}


@pytest.mark.parametrize("key", [None, "sk-wrong"])
async def test_a_missing_or_wrong_key_is_401_in_openai_shape(gateway: Gateway,
                                                             key: str | None) -> None:
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{gateway.openai_base}/chat/completions", headers=headers,
                                   json={"model": "gpt-test", "messages": MESSAGES})
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "authentication_error"
    assert "Traceback" not in response.text


async def test_the_sdk_raises_its_own_errors(gateway: Gateway) -> None:
    with trio.fail_after(20):
        with pytest.raises(openai.AuthenticationError):
            await client(gateway, "sk-nope").chat.completions.create(
                model="gpt-test", messages=MESSAGES)
        with pytest.raises(openai.NotFoundError, match="model 'gpt-nope' does not exist"):
            await client(gateway).chat.completions.create(model="gpt-nope", messages=MESSAGES)
        with pytest.raises(openai.BadRequestError, match="messages"):
            await client(gateway).chat.completions.create(model="gpt-test", messages=[])


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[]", 400, "must be a JSON object"),
        (b"", 400, "body is empty"),
        (b'{"model": "gpt-test"}', 400, "missing required field 'messages'"),
        (b'{"model": 7, "messages": []}', 400, "field 'model' must be a string"),
        (b'{"model": "gpt-test", "messages": [{"role": "wizard", "content": "x"}]}', 400,
         "messages[0].role"),
        (b'{"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], '
         b'"max_tokens": -3}', 400, "field 'max_tokens' must be between 1 and"),
        (b'{"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], '
         b'"temperature": 9}', 400, "'temperature' must be between"),
    ],
)
async def test_malformed_requests_get_precise_400s(
    gateway: Gateway, upstream: FakeUpstream, body: bytes, status: int, fragment: str
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{gateway.openai_base}/chat/completions", content=body,
                                   headers={"authorization": f"Bearer {MASTER_KEY}"})
    assert response.status_code == status
    assert fragment in response.json()["error"]["message"]
    assert not upstream.requests  # nothing reached the upstream


async def test_an_oversized_body_is_413(gateway: Gateway) -> None:
    limit = gateway.services.config.settings.max_body_bytes
    big = {"model": "gpt-test", "messages": [{"role": "user", "content": "x" * (limit + 1)}]}
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{gateway.openai_base}/chat/completions", json=big,
                                   headers={"authorization": f"Bearer {MASTER_KEY}"})
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "request_too_large"


async def test_request_id_is_echoed_or_made(gateway: Gateway) -> None:
    async with httpx.AsyncClient() as http:
        mine = await http.get(f"{gateway.url}/health/liveliness",
                              headers={"x-request-id": "req-123"})
        made = await http.get(f"{gateway.url}/health/liveliness")
        again = await http.get(f"{gateway.url}/health/liveliness")
        missing = await http.get(f"{gateway.url}/nope")
        wrong = await http.get(f"{gateway.openai_base}/chat/completions")
    assert mine.headers["x-request-id"] == "req-123"
    assert len(made.headers["x-request-id"]) == 32
    assert int(made.headers["x-request-id"], 16) != int(again.headers["x-request-id"], 16)
    assert missing.status_code == 404 and missing.headers["x-request-id"]
    assert wrong.status_code == 405 and wrong.headers["allow"] == "OPTIONS, POST"


async def test_upstream_errors_are_mapped_after_retries(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    upstream.fail_next(3, status=500)
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{gateway.openai_base}/chat/completions",
            headers={"authorization": f"Bearer {MASTER_KEY}"},
            json={"model": "gpt-test", "messages": MESSAGES})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_error"
    assert len(upstream.requests) == 3  # num_retries=2: three attempts
    upstream.fail_next(1, status=400, message="context too long")
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{gateway.openai_base}/chat/completions",
            headers={"authorization": f"Bearer {MASTER_KEY}"},
            json={"model": "gpt-test", "messages": MESSAGES})
    assert response.status_code == 400
    assert "context too long" in response.json()["error"]["message"]
    assert len(upstream.requests) == 4  # a request error is not retried


async def test_health_and_metrics(gateway: Gateway) -> None:
    with trio.fail_after(20):
        await client(gateway).chat.completions.create(model="gpt-test", messages=MESSAGES)
    async with httpx.AsyncClient() as http:
        ready = await http.get(f"{gateway.url}/health/readiness")
        metrics = await http.get(f"{gateway.url}/metrics")
    assert ready.json()["redis"] == "connected"
    text = metrics.text
    assert 'triogate_requests_total{deployment="gpt-' in text
    assert "triogate_request_duration_seconds_bucket" in text
    assert 'triogate_redis_waits_per_request_bucket{le="1.0",phase="before"}' in text
    assert "triogate_settler_queue_depth" in text
