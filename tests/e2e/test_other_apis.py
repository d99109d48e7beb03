"""/v1/messages with the anthropic SDK; /v1/responses and /v1/embeddings with the openai
SDK; each through real loopback upstreams, native and translated, with traced waits."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anthropic
import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import BOTH_SERVERS, MASTER_KEY, UPSTREAM_KEY

if TYPE_CHECKING:
    from tests.e2e.conftest import Gateway
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e, BOTH_SERVERS]


def claude(gateway: Gateway, key: str = MASTER_KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key=key, max_retries=0)


def gpt(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY, max_retries=0)


async def waits_of(gateway: Gateway, trace_id: str) -> tuple[int, int]:
    with trio.fail_after(10):
        await gateway.drained()
    assert gateway.services.tracer is not None
    summary = gateway.services.tracer.summary(trace_id)
    return summary.waits_before, summary.waits_after


@pytest.mark.parametrize("group", ["claude-test", "gpt-test"])
async def test_messages_native_and_translated(gateway: Gateway, upstream: FakeUpstream,
                                              group: str) -> None:
    with trio.fail_after(20):
        raw = await claude(gateway).messages.with_raw_response.create(
            model=group, max_tokens=100, system="Be brief.",
            messages=[{"role": "user", "content": "Hello there"}])
    message = await raw.parse()
    assert message.type == "message" and message.content[0].type == "text"
    assert message.content[0].text
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    sent = upstream.requests[-1]
    if group == "claude-test":
        assert sent.path == "/v1/messages" and sent.headers["x-api-key"] == UPSTREAM_KEY
    else:
        assert sent.path == "/v1/chat/completions"
        assert sent.json["messages"][0] == {"role": "system", "content": "Be brief."}
    assert await waits_of(gateway, raw.headers["x-triogate-trace-id"]) == (1, 1)


@pytest.mark.parametrize("group", ["claude-test", "gpt-test"])
async def test_messages_stream_has_anthropic_events(gateway: Gateway, group: str) -> None:
    with trio.fail_after(20):
        async with claude(gateway).messages.stream(
            model=group, max_tokens=100,
            messages=[{"role": "user", "content": "Stream to me"}]) as stream:
            types = [event.type async for event in stream]
            final = await stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "content_block_delta" in types and "message_delta" in types
    assert final.content[0].text and final.usage.output_tokens > 0


async def test_messages_errors_are_in_anthropic_shape(gateway: Gateway) -> None:
    with trio.fail_after(20):
        with pytest.raises(anthropic.AuthenticationError) as auth_error:
            await claude(gateway, "sk-wrong").messages.create(
                model="claude-test", max_tokens=10,
                messages=[{"role": "user", "content": "x"}])
        with pytest.raises(anthropic.NotFoundError, match="model 'nope'"):
            await claude(gateway).messages.create(
                model="nope", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert auth_error.value.body["type"] == "error"  # type: ignore[index]
    async with httpx.AsyncClient() as http:
        broken = await http.post(f"{gateway.url}/v1/messages", content=b"{oops",
                                 headers={"x-api-key": MASTER_KEY})
        no_max = await http.post(f"{gateway.url}/v1/messages", headers={"x-api-key": MASTER_KEY},
                                 json={"model": "claude-test",
                                       "messages": [{"role": "user", "content": "x"}]})
    for response in (broken, no_max):
        assert response.status_code == 400
        assert response.json()["type"] == "error"
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in no_max.json()["error"]["message"]


@pytest.mark.parametrize("group", ["gpt-test", "claude-test"])
async def test_responses_api(gateway: Gateway, group: str) -> None:
    with trio.fail_after(20):
        raw = await gpt(gateway).responses.with_raw_response.create(
            model=group, input="Say something short", instructions="Be brief.",
            max_output_tokens=64)
        reply = raw.parse()
        events = [e async for e in await gpt(gateway).responses.create(
            model=group, input=[{"role": "user", "content": "stream please"}], stream=True)]
    assert reply.output_text
    assert reply.usage is not None and reply.usage.output_tokens > 0
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert any(e.type == "response.output_text.delta" for e in events)
    assert await waits_of(gateway, raw.headers["x-triogate-trace-id"]) == (1, 1)


async def test_responses_unsupported_features_are_400(gateway: Gateway) -> None:
    with trio.fail_after(20), pytest.raises(openai.BadRequestError):
        await gpt(gateway).responses.create(model="gpt-test", input="x",
                                            previous_response_id="resp_123")


async def test_embeddings(gateway: Gateway, upstream: FakeUpstream) -> None:
    with trio.fail_after(20):
        raw = await gpt(gateway).embeddings.with_raw_response.create(
            model="embed-test", input=["one", "two"])
        with pytest.raises(openai.BadRequestError, match="not an embedding model"):
            await gpt(gateway).embeddings.create(model="gpt-test", input="x")
    result = raw.parse()
    assert len(result.data) == 2 and result.data[0].embedding
    assert result.usage.prompt_tokens > 0
    assert upstream.requests[-1].path == "/v1/embeddings"
    assert await waits_of(gateway, raw.headers["x-triogate-trace-id"]) == (1, 1)
