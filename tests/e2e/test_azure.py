"""Azure OpenAI deployments through the gateway, with the openai and anthropic SDKs as
clients and the fake Azure resource (``triogate.testing.fakeazure``) as the upstream."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest
import trio

from tests.e2e.cloud import claude, oai
from tests.e2e.conftest import gateway_config, running_gateway, spend_rows
from triogate.testing.fakeazure import open_fake_azure

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeazure import FakeAzure
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

VERSION = "2024-10-21"
PIXEL = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082")).decode()
TOOL = {"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"]}}}


def _deployment(group: str, ident: str, azure: FakeAzure, **params: Any) -> dict[str, Any]:
    return {"model_name": group, "model_info": {"id": ident, "base_model": "azure/gpt-4o"},
            "litellm_params": {"model": "azure/gpt-4o-prod", "api_base": azure.base_url,
                               "api_version": VERSION, **params}}


@pytest.fixture
async def azure() -> AsyncIterator[FakeAzure]:
    async with open_fake_azure(deployments={"gpt-4o-prod", "embed-prod"},
                               static_tokens={"static-token"}) as fake:
        yield fake


@pytest.fixture
async def gateway(tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
                  azure: FakeAzure) -> AsyncIterator[Gateway]:
    model_list = [
        _deployment("azure-gpt", "az-key", azure, api_key=azure.api_key),
        _deployment("azure-entra", "az-entra", azure, tenant_id="contoso",
                    client_id=azure.client_id, client_secret=azure.client_secret,
                    azure_authority_host=azure.base_url),
        _deployment("azure-static", "az-static", azure, azure_ad_token="static-token"),
        _deployment("azure-badkey", "az-badkey", azure, api_key="not-the-key"),
        _deployment("azure-throttled", "az-throttled", azure, api_key=azure.api_key),
        {"model_name": "azure-embed", "model_info": {"id": "az-embed", "mode": "embedding"},
         "litellm_params": {"model": "azure/embed-prod", "api_base": azure.base_url,
                            "api_key": azure.api_key, "input_cost_per_token": "0.0000001",
                            "output_cost_per_token": 0}},
    ]
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            model_list=model_list,
                            router_settings={"num_retries": 0, "allowed_fails": 2,
                                             "cooldown_time": 60})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


IMAGE_CHAT = [{"role": "user", "content": [
    {"type": "text", "text": "what is in this picture"},
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}]}]
IMAGE_MESSAGES = [{"role": "user", "content": [
    {"type": "text", "text": "what is in this picture"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}]}]


async def test_openai_sdk_chat_with_an_image_and_its_spend_row(
    gateway: Gateway, azure: FakeAzure
) -> None:
    with trio.fail_after(20):
        reply = await oai(gateway).chat.completions.create(model="azure-gpt",
                                                           messages=IMAGE_CHAT)
    assert reply.choices[0].message.content
    sent = azure.requests[-1]
    assert sent.path == "/openai/deployments/gpt-4o-prod/chat/completions"
    assert sent.query == {"api-version": VERSION}
    assert sent.headers["api-key"] == azure.api_key
    assert sent.json["messages"][0]["content"][1]["type"] == "image_url"
    (row,) = await spend_rows(gateway, 1)
    assert reply.usage is not None
    assert (row.input_tokens, row.output_tokens) == (reply.usage.prompt_tokens,
                                                     reply.usage.completion_tokens)
    # gpt-4o's listed price (USD 2.50 and 10 per million tokens), by model_info.base_model.
    assert row.cost_nanousd == row.input_tokens * 2500 + row.output_tokens * 10000 > 0
    assert row.deployment_id == "az-key"


async def test_openai_sdk_stream_and_tool_call(gateway: Gateway) -> None:
    with trio.fail_after(20):
        stream = await oai(gateway).chat.completions.create(
            model="azure-gpt", messages=[{"role": "user", "content": "stream please"}],
            stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        tool = await oai(gateway).chat.completions.create(
            model="azure-gpt", messages=[{"role": "user", "content": "look up trio"}],
            tools=[TOOL], tool_choice="required")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    call = (tool.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "lookup"


async def test_anthropic_sdk_plain_stream_tool_and_image(gateway: Gateway) -> None:
    client = claude(gateway)
    with trio.fail_after(30):
        message = await client.messages.create(model="azure-static", max_tokens=50,
                                               messages=IMAGE_MESSAGES)
        async with client.messages.stream(
            model="azure-entra", max_tokens=50,
            messages=[{"role": "user", "content": "stream it"}]) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        tool = await client.messages.create(
            model="azure-gpt", max_tokens=50,
            messages=[{"role": "user", "content": "look up trio"}],
            tools=[{"name": "lookup", "description": "Look a word up.",
                    "input_schema": TOOL["function"]["parameters"]}],
            tool_choice={"type": "any"})
    assert message.content[0].type == "text" and message.usage.output_tokens > 0
    assert text and final.usage.output_tokens > 0
    (use,) = [b for b in tool.content if b.type == "tool_use"]
    assert use.name == "lookup" and tool.stop_reason == "tool_use"


async def test_responses_and_embeddings(gateway: Gateway, azure: FakeAzure) -> None:
    with trio.fail_after(20):
        response = await oai(gateway).responses.create(model="azure-gpt", input="hello there")
        vectors = await oai(gateway).embeddings.create(model="azure-embed", input=["a", "b"])
    assert response.output_text
    assert len(vectors.data) == 2
    assert azure.requests[-1].path == "/openai/deployments/embed-prod/embeddings"


async def test_entra_id_token_fetched_once_and_sent_as_bearer(
    gateway: Gateway, azure: FakeAzure
) -> None:
    with trio.fail_after(20):
        for _ in range(3):
            await oai(gateway).chat.completions.create(
                model="azure-entra", messages=[{"role": "user", "content": "hi"}])
    assert len(azure.token_requests) == 1
    (form,) = azure.token_requests
    assert form["grant_type"] == "client_credentials"
    assert form["scope"] == "https://cognitiveservices.azure.com/.default"
    assert all(r.headers["authorization"] == "Bearer entra-token-0" for r in azure.requests)
    assert all("api-key" not in r.headers for r in azure.requests)


async def test_entra_id_token_is_refreshed_before_it_expires(
    gateway: Gateway, azure: FakeAzure
) -> None:
    azure.token_lifetime_s = 2.0  # refreshed at half its life, one second
    with trio.fail_after(20):
        await oai(gateway).chat.completions.create(
            model="azure-entra", messages=[{"role": "user", "content": "hi"}])
        await trio.sleep(1.2)
        await oai(gateway).chat.completions.create(
            model="azure-entra", messages=[{"role": "user", "content": "hi"}])
    assert len(azure.token_requests) == 2
    assert azure.requests[-1].headers["authorization"] == "Bearer entra-token-1"


@pytest.mark.parametrize(("kind", "status", "code"), [
    ("throttle", 429, "upstream_rate_limited"),
    ("content_filter", 400, "content_filter"),
    ("context_length", 400, "upstream_error"),
    ("server", 502, "upstream_error"),
])
async def test_upstream_errors_in_the_openai_shape(
    gateway: Gateway, azure: FakeAzure, kind: str, status: int, code: str
) -> None:
    azure.fail_next(kind)
    with trio.fail_after(20), pytest.raises(openai.APIStatusError) as raised:
        await oai(gateway).chat.completions.create(
            model="azure-gpt", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == status
    assert raised.value.code == code
    assert "Traceback" not in raised.value.message


async def test_refused_credentials_are_the_gateways_not_the_clients(gateway: Gateway) -> None:
    with trio.fail_after(20), pytest.raises(openai.APIStatusError) as raised:
        await oai(gateway).chat.completions.create(
            model="azure-badkey", messages=[{"role": "user", "content": "hi"}])
    assert (raised.value.status_code, raised.value.code) == (502, "upstream_auth_failed")
    assert "not-the-key" not in raised.value.message


async def test_upstream_errors_in_the_anthropic_shape(gateway: Gateway, azure: FakeAzure) -> None:
    azure.fail_next("content_filter")
    azure.fail_next("throttle")
    request = {"model": "azure-gpt", "max_tokens": 20,
               "messages": [{"role": "user", "content": "hi"}]}
    with trio.fail_after(20):
        with pytest.raises(anthropic.BadRequestError) as filtered:
            await claude(gateway).messages.create(**request)
        with pytest.raises(anthropic.RateLimitError):
            await claude(gateway).messages.create(**request)
    assert "content management policy" in filtered.value.message


async def test_repeated_throttling_cools_the_deployment_down(
    gateway: Gateway, azure: FakeAzure
) -> None:
    azure.fail_next("throttle", 100)
    with trio.fail_after(30):
        for _ in range(3):
            with pytest.raises(openai.APIStatusError):
                await oai(gateway).chat.completions.create(
                    model="azure-throttled", messages=[{"role": "user", "content": "hi"}])
        sent = len(azure.requests)
        with pytest.raises(openai.APIStatusError):
            await oai(gateway).chat.completions.create(
                model="azure-throttled", messages=[{"role": "user", "content": "hi"}])
        cooldown = await gateway.services.backends["counters"].execute(
            [("HGET", "tg:{rt:azure-throttled}:cooldown", "az-throttled")])
    assert cooldown[0] is not None
    assert len(azure.requests) == sent  # cooled down: not called again


@pytest.mark.parametrize("stream", [False, True])
async def test_a_governed_request_waits_on_redis_once_before_and_once_after(
    gateway: Gateway, stream: bool
) -> None:
    store = gateway.services.store
    assert store is not None
    raw, _ = await store.create_key(max_budget_nanousd=10**10, budget_duration="1d",
                                    tpm_limit=100_000, rpm_limit=100)
    headers = {"authorization": f"Bearer {raw}"}
    body = {"messages": [{"role": "user", "content": "count my waits"}], "stream": stream}
    async with httpx.AsyncClient(timeout=20) as http:
        warm = await http.post(f"{gateway.openai_base}/chat/completions",
                               json={"model": "azure-gpt", **body}, headers=headers)
        assert warm.status_code == 200, warm.text
        # The first call of the Entra ID group: its token fetch is not a Redis wait.
        response = await http.post(f"{gateway.openai_base}/chat/completions",
                                   json={"model": "azure-entra", **body}, headers=headers)
    assert response.status_code == 200, response.text
    with trio.fail_after(10):
        await gateway.services.settler.wait_drained()
    assert gateway.services.tracer is not None
    summary = gateway.services.tracer.summary(response.headers["x-triogate-trace-id"])
    assert (summary.waits_before, summary.waits_after) == (1, 1)


async def test_concurrent_first_requests_share_one_token_request(
    gateway: Gateway, azure: FakeAzure
) -> None:
    async def ask() -> None:
        await oai(gateway).chat.completions.create(
            model="azure-entra", messages=[{"role": "user", "content": "hi"}])

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(ask)
    assert len(azure.token_requests) == 1
    assert len(azure.requests) == 5


async def test_a_refused_token_request_is_the_gateways_failure(
    gateway: Gateway, azure: FakeAzure
) -> None:
    azure.client_secret = "rotated"  # the configured secret is no longer valid
    with trio.fail_after(20), pytest.raises(openai.APIStatusError) as raised:
        await oai(gateway).chat.completions.create(
            model="azure-entra", messages=[{"role": "user", "content": "hi"}])
    assert (raised.value.status_code, raised.value.code) == (502, "upstream_auth_failed")
    assert "client-secret" not in str(raised.value.body)
    assert azure.requests == []
