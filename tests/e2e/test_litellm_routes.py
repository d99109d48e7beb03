"""LiteLLM's paths through the official SDKs: without /v1, legacy completions, Azure-style
deployments, and the model endpoints; each model route keeps one wait before, one after."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anthropic
import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, UPSTREAM_KEY

if TYPE_CHECKING:
    from tests.e2e.conftest import Gateway
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

HI = [{"role": "user", "content": "say something short"}]


def bare(gateway: Gateway) -> openai.AsyncOpenAI:
    """A client whose base URL has no /v1 (LiteLLM's docs use both)."""
    return openai.AsyncOpenAI(base_url=gateway.url, api_key=MASTER_KEY, max_retries=0)


async def test_model_routes_without_v1(gateway: Gateway, upstream: FakeUpstream) -> None:
    client = bare(gateway)
    with trio.fail_after(30):
        reply = await client.chat.completions.create(model="gpt-test", messages=HI)
        vectors = await client.embeddings.create(model="embed-test", input="hello")
        answer = await client.responses.create(model="gpt-test", input="hello")
        listed = [m.id async for m in client.models.list()]
        message = await anthropic.AsyncAnthropic(
            base_url=gateway.url, api_key=MASTER_KEY, max_retries=0,
        ).messages.create(model="claude-test", max_tokens=20, messages=HI)
    assert reply.choices[0].message.content
    assert vectors.data[0].embedding
    assert answer.output_text
    assert "gpt-test" in listed
    assert message.content
    async with httpx.AsyncClient(timeout=20) as http:
        direct = await http.post(f"{gateway.url}/messages", headers={
            "x-api-key": MASTER_KEY, "anthropic-version": "2023-06-01"},
            json={"model": "claude-test", "max_tokens": 20, "messages": HI})
    assert direct.status_code == 200 and direct.json()["type"] == "message"


@pytest.mark.parametrize("group", ["gpt-test", "claude-test"])
async def test_legacy_completions(gateway: Gateway, upstream: FakeUpstream, group: str
                                  ) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY,
                                max_retries=0)
    with trio.fail_after(30):
        done = await client.completions.create(model=group, prompt="Once upon a time",
                                               max_tokens=20)
    assert done.object == "text_completion" and done.choices[0].text
    assert done.usage is not None and done.usage.completion_tokens > 0
    sent = upstream.requests[-1].json
    assert "prompt" not in sent and sent["max_tokens"] == 20
    with trio.fail_after(30):
        stream = await bare(gateway).completions.create(
            model=group, prompt="Once upon a time", stream=True,
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    with trio.fail_after(30), pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=group, prompt="x", echo=True)
    assert info.value.body["param"] == "echo"  # type: ignore[index]


async def test_azure_style_deployments(gateway: Gateway, upstream: FakeUpstream) -> None:
    client = openai.AsyncAzureOpenAI(azure_endpoint=gateway.url, api_key=MASTER_KEY,
                                     api_version="2024-06-01", max_retries=0)
    with trio.fail_after(30):
        reply = await client.chat.completions.create(model="gpt-test", messages=HI)
        vectors = await client.embeddings.create(model="embed-test", input="hello")
        stream = await client.chat.completions.create(model="claude-test", messages=HI,
                                                      stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream
                        if c.choices])
    assert reply.choices[0].message.content
    assert vectors.data[0].embedding
    assert text
    assert upstream.requests[-1].path == "/v1/messages"
    with trio.fail_after(30), pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="no-such-model", messages=HI)


async def _get(gateway: Gateway, path: str, key: str = MASTER_KEY) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.get(f"{gateway.url}{path}",
                              headers={"authorization": f"Bearer {key}"})


async def test_model_info_endpoints_never_show_keys(gateway: Gateway) -> None:
    info = await _get(gateway, "/model/info")
    assert info.status_code == 200
    assert UPSTREAM_KEY not in info.text
    rows = {r["model_info"]["id"]: r for r in info.json()["data"]}
    assert rows["gpt-a"]["model_name"] == "gpt-test"
    assert rows["gpt-a"]["litellm_params"]["model"] == "openai/gpt-up-a"
    assert rows["gpt-a"]["model_info"]["input_cost_per_token"] == pytest.approx(1e-6)
    assert rows["embed"]["model_info"]["mode"] == "embedding"
    one = (await _get(gateway, "/model/info?litellm_model_id=claude")).json()["data"]
    assert [r["model_name"] for r in one] == ["claude-test"]
    page = (await _get(gateway, "/v2/model/info?size=2&page=2")).json()
    assert (page["total_count"], page["total_pages"], len(page["data"])) == (4, 2, 2)
    assert (await _get(gateway, "/v2/model/info?page=0")).status_code == 400
    groups = {g["model_group"]: g for g in (await _get(gateway, "/model_group/info")).json()[
        "data"]}
    assert groups["gpt-test"]["providers"] == ["openai"]
    assert groups["gpt-test"]["output_cost_per_token"] == pytest.approx(2e-6)
    assert UPSTREAM_KEY not in (await _get(gateway, "/model_group/info")).text
    assert (await _get(gateway, "/v1/models/gpt-test")).json()["id"] == "gpt-test"
    missing = await _get(gateway, "/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


async def test_a_key_sees_only_its_models(gateway: Gateway) -> None:
    store = gateway.services.store
    assert store is not None
    key, _ = await store.create_key(models=["gpt-test"])
    listed = [m["id"] for m in (await _get(gateway, "/v1/models", key)).json()["data"]]
    assert listed == ["gpt-test"]
    info = (await _get(gateway, "/model/info", key)).json()["data"]
    assert {r["model_name"] for r in info} == {"gpt-test"}
    assert (await _get(gateway, "/v1/models/claude-test", key)).status_code == 404
    assert (await _get(gateway, "/health", key)).status_code == 403


async def test_health_calls_every_deployment(gateway: Gateway, upstream: FakeUpstream
                                             ) -> None:
    before = len(upstream.requests)
    upstream.fail_next(1, 500)
    with trio.fail_after(30):
        report = (await _get(gateway, "/health")).json()
    assert len(upstream.requests) - before == 4  # every deployment, once
    assert (report["healthy_count"], report["unhealthy_count"]) == (3, 1)
    assert "error" in report["unhealthy_endpoints"][0]
    assert UPSTREAM_KEY not in str(report)
    with trio.fail_after(30):
        one = (await _get(gateway, "/health?model=embed-test")).json()
    assert [e["model_id"] for e in one["healthy_endpoints"]] == ["embed"]
    assert (await _get(gateway, "/health?model=nope")).status_code == 404
    store = gateway.services.store
    assert store is not None
    await store.create_user(user_id="ops", user_role="proxy_admin")
    admin_key, _ = await store.create_key(user_id="ops")
    with trio.fail_after(30):  # a proxy_admin user's key, as in LiteLLM
        assert (await _get(gateway, "/health?model=embed-test", admin_key)).status_code == 200
