"""Gemini API and Vertex AI deployments through the gateway, driven by the openai and
anthropic SDKs, against the Gemini fake (``triogate.testing.fakegemini``) over loopback."""

from __future__ import annotations

import base64
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
from triogate.testing.fakegemini import open_fake_gemini

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakegemini import FakeGemini

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

GEMINI_KEY = "gemini-upstream-key"
PRICE = {"input_cost_per_token": "0.000001", "output_cost_per_token": "0.000002"}


def cloud_models(fake: FakeGemini, credentials: str) -> list[dict[str, Any]]:
    return [
        {"model_name": "gemini-test", "litellm_params": {
            "model": "gemini/gemini-2.0-flash", "api_base": f"{fake.base_url}/v1beta",
            "api_key": GEMINI_KEY, **PRICE}, "model_info": {"id": "gemini"}},
        {"model_name": "gemini3-test", "litellm_params": {  # a thinking model
            "model": "gemini/gemini-3-pro-preview", "api_base": fake.base_url,
            "api_key": GEMINI_KEY, **PRICE}, "model_info": {"id": "gemini3"}},
        {"model_name": "vertex-test", "litellm_params": {
            "model": "vertex_ai/gemini-1.5-pro", "api_base": fake.base_url,
            "vertex_project": "test-project", "vertex_location": "europe-west4",
            "vertex_credentials": credentials, **PRICE}, "model_info": {"id": "vertex"}},
        {"model_name": "vertex-claude", "litellm_params": {
            "model": "vertex_ai/claude-3-5-sonnet-v2@20241022", "api_base": fake.base_url,
            "vertex_project": "test-project", "vertex_location": "us-east5",
            "vertex_credentials": credentials, **PRICE}, "model_info": {"id": "vertex-claude"}},
        {"model_name": "gemini-embed", "litellm_params": {
            "model": "gemini/text-embedding-004", "api_base": f"{fake.base_url}/v1beta",
            "api_key": GEMINI_KEY, "input_cost_per_token": "0.0000001"},
         "model_info": {"id": "gemini-embed", "mode": "embedding"}},
        {"model_name": "vertex-embed", "litellm_params": {
            "model": "vertex_ai/text-embedding-005", "api_base": fake.base_url,
            "vertex_project": "test-project", "vertex_credentials": credentials,
            "input_cost_per_token": "0.0000001"},
         "model_info": {"id": "vertex-embed", "mode": "embedding"}},
    ]


@pytest.fixture
async def fake() -> AsyncIterator[FakeGemini]:
    async with open_fake_gemini(api_key=GEMINI_KEY, max_input_tokens=200) as server:
        yield server


@pytest.fixture
async def gateway(tmp_path: Path, redis: RespBackend, redis_url: str, fake: FakeGemini
                  ) -> AsyncIterator[Gateway]:
    # The service account as a file, as GOOGLE_APPLICATION_CREDENTIALS would name it.
    credentials = tmp_path / "service-account.json"
    await trio.Path(credentials).write_bytes(orjson.dumps(fake.service_account()))
    config = cloud_config(tmp_path, redis_url, cloud_models(fake, str(credentials)))
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


@pytest.mark.parametrize("model", ["gemini-test", "vertex-test"])
async def test_chat_plain_with_usage_and_cost_on_the_spend_row(
    gateway: Gateway, fake: FakeGemini, model: str
) -> None:
    with trio.fail_after(20):
        reply = await oai(gateway).chat.completions.create(
            model=model, max_tokens=50,
            messages=[{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "what is a nursery"}])
    upstream = "gemini-2.0-flash" if model == "gemini-test" else "gemini-1.5-pro"
    assert reply.choices[0].message.content == (
        f"Fake reply from {upstream}. You said: what is a nursery")
    assert reply.choices[0].finish_reason == "stop"
    sent = fake.requests[-1].json
    assert sent["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert sent["generationConfig"] == {"maxOutputTokens": 50}
    # The fake counts words: 7 + 2 (system) + 4 (user) in, 10 words out.
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (13, 10)
    (row,) = await spend_rows(gateway, 1)
    assert (row.input_tokens, row.output_tokens) == (13, 10)
    assert row.cost_nanousd == 13 * 1000 + 10 * 2000
    assert row.upstream_model == upstream


async def test_vertex_token_is_fetched_once_and_cached(
    gateway: Gateway, fake: FakeGemini
) -> None:
    for _ in range(3):
        with trio.fail_after(20):
            await oai(gateway).chat.completions.create(
                model="vertex-test", messages=[{"role": "user", "content": "hi"}])
    assert fake.token_requests == 1
    paths = {r.path for r in fake.requests}
    assert paths == {"/v1/projects/test-project/locations/europe-west4/publishers/google/"
                     "models/gemini-1.5-pro:generateContent"}


@pytest.mark.parametrize("model", ["gemini-test", "vertex-test"])
async def test_chat_stream_with_usage(gateway: Gateway, fake: FakeGemini, model: str) -> None:
    with trio.fail_after(20):
        stream = await oai(gateway).chat.completions.create(
            model=model, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "stream me some words"}])
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.endswith("You said: stream me some words")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(text.split())
    assert fake.requests[-1].path.endswith(":streamGenerateContent")
    (row,) = await spend_rows(gateway, 1)
    assert row.output_tokens == len(text.split())


@pytest.mark.parametrize("model", ["gemini-test", "gemini3-test"])
async def test_chat_tool_call_and_its_result_round_trip(
    gateway: Gateway, fake: FakeGemini, model: str
) -> None:
    client = oai(gateway)
    question = {"role": "user", "content": "weather in Paris"}
    with trio.fail_after(20):
        reply = await client.chat.completions.create(
            model=model, messages=[question], tools=[TOOL], tool_choice="required")
    (call,) = reply.choices[0].message.tool_calls or []
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments) == {"query": "weather in Paris"}
    declared = fake.requests[-1].json["tools"][0]["functionDeclarations"][0]
    assert declared["parametersJsonSchema"] == TOOL["function"]["parameters"]  # type: ignore[index]
    with trio.fail_after(20):
        answer = await client.chat.completions.create(
            model=model, tools=[TOOL],
            messages=[question, reply.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}])
    assert answer.choices[0].message.content
    turns = fake.requests[-1].json["contents"]
    assert [t["role"] for t in turns] == ["user", "model", "user"]
    assert turns[2]["parts"][0]["functionResponse"] == {
        "name": "get_weather", "response": {"temp_c": 21}}
    # The call's thought signature went back with it (a thinking model refuses it without).
    assert turns[1]["parts"][0]["thoughtSignature"]


async def test_chat_stream_tool_call(gateway: Gateway) -> None:
    with trio.fail_after(20):
        stream = await oai(gateway).chat.completions.create(
            model="vertex-test", stream=True, tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            messages=[{"role": "user", "content": "weather in Oslo"}])
        chunks = [c async for c in stream]
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    assert calls[0].function.name == "get_weather"
    arguments = "".join(t.function.arguments or "" for t in calls)
    assert orjson.loads(arguments) == {"query": "weather in Oslo"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert all(c.usage is None for c in chunks)  # not asked for: the usage chunk is held


async def test_chat_image_reaches_gemini_inline(gateway: Gateway, fake: FakeGemini) -> None:
    with trio.fail_after(20):
        reply = await oai(gateway).chat.completions.create(model="gemini-test", messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "what is in this image"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
            ]}])
    assert "[image/png]" in (reply.choices[0].message.content or "")
    part = fake.requests[-1].json["contents"][0]["parts"][1]
    assert part == {"inlineData": {"mimeType": "image/png", "data": PNG_B64}}


@pytest.mark.parametrize("model", ["gemini-test", "vertex-test"])
async def test_messages_plain_stream_tool_and_image(
    gateway: Gateway, fake: FakeGemini, model: str
) -> None:
    client = claude(gateway)
    with trio.fail_after(30):
        message = await client.messages.create(
            model=model, max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": [
                {"type": "text", "text": "describe"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": PNG_B64}}]}])
        assert message.content[0].type == "text" and "[image/png]" in message.content[0].text
        assert message.stop_reason == "end_turn" and message.usage.input_tokens > 0
        async with client.messages.stream(
            model=model, max_tokens=64,
            messages=[{"role": "user", "content": "stream in messages"}]) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert text.endswith("You said: stream in messages")
        assert final.usage.output_tokens == len(text.split())
        tooled = await client.messages.create(
            model=model, max_tokens=64, tool_choice={"type": "any"},
            tools=[{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}],  # type: ignore[index]
            messages=[{"role": "user", "content": "weather in Rome"}])
    assert tooled.stop_reason == "tool_use"
    (block,) = [b for b in tooled.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input == {"query": "weather in Rome"}
    await spend_rows(gateway, 3)


async def test_responses_api(gateway: Gateway) -> None:
    with trio.fail_after(20):
        response = await oai(gateway).responses.create(model="gemini-test",
                                                       input="hello responses")
    assert response.output_text.endswith("You said: hello responses")
    assert response.usage is not None and response.usage.output_tokens > 0


@pytest.mark.parametrize("model", ["gemini-embed", "vertex-embed"])
async def test_embeddings(gateway: Gateway, fake: FakeGemini, model: str) -> None:
    with trio.fail_after(20):
        one = await oai(gateway).embeddings.create(model=model, input="hello there")
        many = await oai(gateway).embeddings.create(model=model, input=["a b", "c d e"],
                                                    dimensions=4)
    assert len(one.data) == 1 and len(one.data[0].embedding) == 8
    assert [len(d.embedding) for d in many.data] == [4, 4]
    if model == "vertex-embed":  # Vertex AI reports token counts
        assert many.usage.prompt_tokens == 5
        assert fake.requests[-1].path.endswith("/models/text-embedding-005:predict")
    else:
        assert fake.requests[-1].path.endswith(":batchEmbedContents")
        assert fake.requests[-2].path.endswith(":embedContent")


CHAT = {"model": "gemini-test", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "gemini-test", "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("kind", ["throttling", "server", "context_length", "auth"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_upstream_errors_in_the_clients_shape(
    gateway: Gateway, fake: FakeGemini, path: str, kind: str
) -> None:
    body = MESSAGES if path == "/v1/messages" else CHAT
    if kind == "throttling":
        fake.fail_next(1, status=429, message="Resource has been exhausted (e.g. check quota).")
    elif kind == "server":
        fake.fail_next(1, status=500, message="An internal error has occurred.")
    elif kind == "context_length":
        body = {**body, "messages": [{"role": "user", "content": " ".join(["word"] * 300)}]}
    else:
        fake.api_key = "rotated-key"  # the gateway's key is now refused (Google says 400)
    response = await post(gateway, path, body)
    expected = {"throttling": (429, "rate_limit_error", "exhausted"),
                "server": (502, "api_error", "internal error"),
                "context_length": (400, "invalid_request_error",
                                   "exceeds the maximum number of tokens"),
                "auth": (502, "api_error", "credentials")}[kind]
    check_error(response, path, GEMINI_KEY, expected)


async def test_an_error_mid_stream_ends_the_stream_with_an_error(
    gateway: Gateway, fake: FakeGemini
) -> None:
    fake.stream_error_after = 3
    raw = await streamed(f"{gateway.openai_base}/chat/completions", {
        "model": "gemini-test", "stream": True,
        "messages": [{"role": "user", "content": "a long enough prompt to stream"}]})
    assert raw.count(b'"content"') >= 3  # what came before the error went on
    assert b'"error"' in raw and b"upstream rate limit" in raw
    (row,) = await spend_rows(gateway, 1)
    assert row.status != "success"


async def test_repeated_throttling_cools_the_deployment_down(
    gateway: Gateway, fake: FakeGemini
) -> None:
    fake.fail_next(1000, status=429, message="Resource has been exhausted.")
    # allowed_fails=2: two throttled calls reach Google, then the deployment cools down
    # and the gateway answers without calling it.
    await throttled_until_cooled_down(gateway, CHAT, "gemini-test", "gemini")
    model_calls = [r for r in fake.requests if r.path.endswith(":generateContent")]
    assert len(model_calls) == 2


@pytest.mark.parametrize("model", ["gemini-test", "vertex-test", "gemini-embed"])
async def test_a_governed_request_waits_on_redis_once_before_and_once_after(
    gateway: Gateway, model: str
) -> None:
    await governed_waits(gateway, model, embedding=model == "gemini-embed")


def test_png_fixture_is_an_image() -> None:
    assert base64.b64decode(PNG_B64).startswith(b"\x89PNG")


@pytest.mark.parametrize("model", ["gemini-test", "vertex-test"])
async def test_messages_and_responses_streams_with_a_tool_call(
    gateway: Gateway, model: str
) -> None:
    await streamed_tool_calls(gateway.url, model)


async def test_claude_on_vertex_speaks_the_messages_api(
    gateway: Gateway, fake: FakeGemini
) -> None:
    model = "claude-3-5-sonnet-v2@20241022"
    with trio.fail_after(30):
        reply = await oai(gateway).chat.completions.create(
            model="vertex-claude", max_tokens=40,
            messages=[{"role": "user", "content": "hello claude"}])
        sent = fake.requests[-1]
        stream = await oai(gateway).chat.completions.create(
            model="vertex-claude", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "stream claude"}])
        chunks = [c async for c in stream]
        async with claude(gateway).messages.stream(
            model="vertex-claude", max_tokens=64, tool_choice={"type": "any"},
            tools=[{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}],  # type: ignore[index]
            messages=[{"role": "user", "content": "weather in Lyon"}]) as messages:
            final = await messages.get_final_message()
    assert reply.choices[0].message.content == f"Fake reply from {model}. You said: hello claude"
    assert sent.path == ("/v1/projects/test-project/locations/us-east5/publishers/anthropic/"
                         f"models/{model}:rawPredict")
    assert sent.json["anthropic_version"] == "vertex-2023-10-16" and "model" not in sent.json
    assert sent.headers["authorization"].startswith("Bearer ya29.fake-")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.endswith("You said: stream claude")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert fake.requests[-2].path.endswith(":streamRawPredict")
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input == {"query": "weather in Lyon"}
    rows = await spend_rows(gateway, 3)
    assert all(r.upstream_model == model and r.output_tokens > 0 for r in rows)
