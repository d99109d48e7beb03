"""Amazon Bedrock deployments through the gateway, driven by the openai and anthropic SDKs,
against the Bedrock fake (``triogate.testing.fakebedrock``), which checks every SigV4
signature with botocore's signer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from tests.e2e.cloud import (
    PNG_B64,
    TOOL,
    check_error,
    claude,
    cloud_config,
    error_of,
    governed_waits,
    oai,
    post,
    streamed_tool_calls,
    throttled_until_cooled_down,
)
from tests.e2e.conftest import (
    running_gateway,
    spend_rows,
    streamed,
)
from triogate.testing.fakebedrock import open_fake_bedrock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakebedrock import FakeBedrock

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0"
LLAMA = "meta.llama3-1-70b-instruct-v1:0"
PRICE = {"input_cost_per_token": "0.000003", "output_cost_per_token": "0.000015"}


@pytest.fixture
async def fake() -> AsyncIterator[FakeBedrock]:
    async with open_fake_bedrock(session_token="session-token", max_input_tokens=200) as server:
        yield server


def bedrock_models(fake: FakeBedrock) -> list[dict[str, Any]]:
    aws = {"api_base": fake.base_url, "aws_access_key_id": fake.access_key_id,
           "aws_secret_access_key": fake.secret_access_key,
           "aws_session_token": fake.session_token, "aws_region_name": fake.region}
    return [
        {"model_name": "bedrock-claude", "litellm_params": {
            "model": f"bedrock/{CLAUDE}", **aws, **PRICE}, "model_info": {"id": "claude"}},
        {"model_name": "bedrock-llama", "litellm_params": {
            "model": f"bedrock/converse/{LLAMA}", **aws, **PRICE},
         "model_info": {"id": "llama"}},
        {"model_name": "titan-embed", "litellm_params": {
            "model": "bedrock/amazon.titan-embed-text-v2:0", **aws,
            "input_cost_per_token": "0.00000002"},
         "model_info": {"id": "titan", "mode": "embedding"}},
        {"model_name": "cohere-embed", "litellm_params": {
            "model": "bedrock/cohere.embed-english-v3", **aws,
            "input_cost_per_token": "0.0000001"},
         "model_info": {"id": "cohere", "mode": "embedding"}},
    ]


@pytest.fixture
async def gateway(tmp_path: Path, redis: RespBackend, redis_url: str, fake: FakeBedrock
                  ) -> AsyncIterator[Gateway]:
    config = cloud_config(tmp_path, redis_url, bedrock_models(fake))
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


@pytest.mark.parametrize(("model", "upstream"), [("bedrock-claude", CLAUDE),
                                                 ("bedrock-llama", LLAMA)])
async def test_chat_plain_signed_with_usage_and_cost(
    gateway: Gateway, fake: FakeBedrock, model: str, upstream: str
) -> None:
    with trio.fail_after(20):
        reply = await oai(gateway).chat.completions.create(
            model=model, max_tokens=50, temperature=0.5,
            messages=[{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "what is a nursery"}])
    assert reply.choices[0].message.content == (
        f"Fake reply from {upstream}. You said: what is a nursery")
    path, headers, body = fake.requests[-1]
    assert path == f"/model/{upstream.replace(':', '%3A')}/converse"
    assert fake.verified == 1  # botocore's signer agrees with the gateway's signature
    assert headers["x-amz-security-token"] == "session-token"
    assert body["system"] == [{"text": "Be brief."}]
    assert body["inferenceConfig"] == {"maxTokens": 50, "temperature": 0.5}
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (13, 10)
    (row,) = await spend_rows(gateway, 1)
    assert (row.input_tokens, row.output_tokens) == (13, 10)
    assert row.cost_nanousd == 13 * 3000 + 10 * 15000


async def test_chat_stream_from_the_event_stream(gateway: Gateway, fake: FakeBedrock) -> None:
    with trio.fail_after(20):
        stream = await oai(gateway).chat.completions.create(
            model="bedrock-claude", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "stream me some words"}])
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.endswith("You said: stream me some words")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(text.split())
    assert fake.requests[-1][0].endswith("/converse-stream")
    assert fake.requests[-1][1]["accept"] == "application/vnd.amazon.eventstream"
    (row,) = await spend_rows(gateway, 1)
    assert row.output_tokens == len(text.split())


async def test_chat_tool_call_and_its_result_round_trip(
    gateway: Gateway, fake: FakeBedrock
) -> None:
    client = oai(gateway)
    question = {"role": "user", "content": "weather in Paris"}
    with trio.fail_after(20):
        reply = await client.chat.completions.create(
            model="bedrock-claude", messages=[question], tools=[TOOL], tool_choice="required")
    (call,) = reply.choices[0].message.tool_calls or []
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments) == {"query": "weather in Paris"}
    spec = fake.requests[-1][2]["toolConfig"]["tools"][0]["toolSpec"]
    assert spec["inputSchema"]["json"] == TOOL["function"]["parameters"]  # type: ignore[index]
    with trio.fail_after(20):
        answer = await client.chat.completions.create(
            model="bedrock-claude", tools=[TOOL],
            messages=[question, reply.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "21 C"}])
    assert answer.choices[0].finish_reason == "stop"
    turns = fake.requests[-1][2]["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[2]["content"][0]["toolResult"] == {
        "toolUseId": call.id, "content": [{"text": "21 C"}]}


async def test_chat_stream_tool_call(gateway: Gateway) -> None:
    with trio.fail_after(20):
        stream = await oai(gateway).chat.completions.create(
            model="bedrock-llama", stream=True, tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            messages=[{"role": "user", "content": "weather in Oslo"}])
        chunks = [c async for c in stream]
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    assert calls[0].function.name == "get_weather" and calls[0].id
    arguments = "".join(t.function.arguments or "" for t in calls)
    assert orjson.loads(arguments) == {"query": "weather in Oslo"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert all(c.usage is None for c in chunks)  # not asked for: the usage chunk is held


async def test_chat_image(gateway: Gateway, fake: FakeBedrock) -> None:
    with trio.fail_after(20):
        reply = await oai(gateway).chat.completions.create(model="bedrock-claude", messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "what is in this image"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
            ]}])
    assert "[image/png]" in (reply.choices[0].message.content or "")
    block = fake.requests[-1][2]["messages"][0]["content"][1]
    assert block == {"image": {"format": "png", "source": {"bytes": PNG_B64}}}


async def test_messages_plain_stream_tool_and_image(gateway: Gateway) -> None:
    client = claude(gateway)
    with trio.fail_after(30):
        message = await client.messages.create(
            model="bedrock-claude", max_tokens=64, system="Be brief.", messages=[
                {"role": "user", "content": [
                    {"type": "text", "text": "describe"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": PNG_B64}}]}])
        assert message.content[0].type == "text" and "[image/png]" in message.content[0].text
        assert message.stop_reason == "end_turn" and message.usage.input_tokens > 0
        async with client.messages.stream(
            model="bedrock-claude", max_tokens=64,
            messages=[{"role": "user", "content": "stream in messages"}]) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert text.endswith("You said: stream in messages")
        assert final.usage.output_tokens == len(text.split())
        tooled = await client.messages.create(
            model="bedrock-claude", max_tokens=64, tool_choice={"type": "any"},
            tools=[{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}],  # type: ignore[index]
            messages=[{"role": "user", "content": "weather in Rome"}])
    assert tooled.stop_reason == "tool_use"
    (block,) = [b for b in tooled.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input == {"query": "weather in Rome"}
    await spend_rows(gateway, 3)


async def test_responses_api_plain_and_streamed(gateway: Gateway) -> None:
    with trio.fail_after(20):
        response = await oai(gateway).responses.create(model="bedrock-claude",
                                                       input="hello responses")
        events = [e async for e in await oai(gateway).responses.create(
            model="bedrock-claude", input="hello stream", stream=True)]
    assert response.output_text.endswith("You said: hello responses")
    assert response.usage is not None and response.usage.output_tokens > 0
    assert events[-1].type == "response.completed"


@pytest.mark.parametrize(("model", "reported"), [("titan-embed", True),
                                                 ("cohere-embed", False)])
async def test_embeddings_through_invoke_model(
    gateway: Gateway, fake: FakeBedrock, model: str, reported: bool
) -> None:
    with trio.fail_after(20):
        many = await oai(gateway).embeddings.create(model=model, input=["a b", "c d e"])
    assert [len(d.embedding) for d in many.data] == [8, 8]
    assert fake.requests[-1][0].endswith("/invoke")
    if reported:  # Titan counts tokens (words, in the fake); one call per input
        assert many.usage.prompt_tokens == 5
        assert [r[2]["inputText"] for r in fake.requests[-2:]] == ["a b", "c d e"]
    else:
        assert fake.requests[-1][2] == {"texts": ["a b", "c d e"],
                                        "input_type": "search_document"}


CHAT = {"model": "bedrock-claude", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "bedrock-claude", "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("kind", ["throttling", "server", "context_length", "auth"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_upstream_errors_in_the_clients_shape(
    gateway: Gateway, fake: FakeBedrock, path: str, kind: str
) -> None:
    body = MESSAGES if path == "/v1/messages" else CHAT
    if kind == "throttling":
        fake.fail_next(1, "ThrottlingException", message="Too many requests, please wait.")
    elif kind == "server":
        fake.fail_next(1, "InternalServerException", message="An internal error occurred.")
    elif kind == "context_length":
        body = {**body, "messages": [{"role": "user", "content": " ".join(["word"] * 300)}]}
    else:
        fake.secret_access_key = "rotated"  # the gateway's signatures no longer match
    response = await post(gateway, path, body)
    assert "rotated" not in response.text
    expected = {"throttling": (429, "rate_limit_error", "Too many requests"),
                "server": (502, "api_error", "internal error"),
                "context_length": (400, "invalid_request_error", "Input is too long"),
                "auth": (502, "api_error", "credentials")}[kind]
    check_error(response, path, fake.secret_access_key, expected)


async def test_throttling_mid_stream_ends_the_stream_with_an_error(
    gateway: Gateway, fake: FakeBedrock
) -> None:
    fake.stream_exception_after = 4
    raw = await streamed(f"{gateway.openai_base}/chat/completions", {**CHAT, "stream": True})
    assert raw.count(b'"content"') >= 2  # what came before the exception went on
    assert b'"error"' in raw and b"upstream rate limit" in raw
    (row,) = await spend_rows(gateway, 1)
    assert row.status != "success"


async def test_repeated_throttling_cools_the_deployment_down(
    gateway: Gateway, fake: FakeBedrock
) -> None:
    fake.fail_next(1000, "ThrottlingException", message="Too many requests, please wait.")
    await throttled_until_cooled_down(gateway, CHAT, "bedrock-claude", "claude")
    assert len([r for r in fake.requests if r[0].endswith("/converse")]) == 2


@pytest.mark.parametrize("model", ["bedrock-claude", "titan-embed"])
async def test_a_governed_request_waits_on_redis_once_before_and_once_after(
    gateway: Gateway, model: str
) -> None:
    await governed_waits(gateway, model, embedding=model == "titan-embed")


async def test_messages_and_responses_streams_with_a_tool_call(gateway: Gateway) -> None:
    await streamed_tool_calls(gateway.url, "bedrock-claude")


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]},
     "base64 data URLs"),
    ("/v1/chat/completions", {**CHAT, "n": 2}, "n > 1"),
    ("/v1/embeddings", {"model": "titan-embed", "input": [[1, 2, 3]]}, "string"),
])
async def test_what_bedrock_cannot_take_is_a_400_before_any_call(
    gateway: Gateway, fake: FakeBedrock, path: str, body: dict[str, Any], words: str
) -> None:
    response = await post(gateway, path, body)
    assert response.status_code == 400, response.text
    error = error_of(response, anthropic_shape=False, secret=fake.secret_access_key)
    assert error["type"] == "invalid_request_error" and words in error["message"]
    assert fake.requests == []  # refused before anything was sent
