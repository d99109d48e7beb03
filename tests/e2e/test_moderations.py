"""``POST /v1/moderations`` through the official OpenAI SDK, passed to an OpenAI-compatible
deployment with ``model_info.mode: moderation`` (the fake upstream over real HTTP), and
governed like any model call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest
import trio

from tests.e2e.conftest import UPSTREAM_KEY, gateway_config, running_gateway, spend_rows
from tests.e2e.test_admin_api import admin_client
from triogate.config import parse_config
from triogate.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def moderation_model(upstream_url: str) -> dict[str, Any]:
    return {"model_name": "text-moderation", "litellm_params": {
        "model": "openai/omni-moderation-latest", "api_base": f"{upstream_url}/v1",
        "api_key": UPSTREAM_KEY}, "model_info": {"id": "mod", "mode": "moderation"}}


@pytest.fixture
async def gw(tmp_path: Path, redis: RespBackend, redis_url: str,
             upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    raw_models = [
        {"model_name": "gpt-test", "litellm_params": {
            "model": "openai/gpt-up-a", "api_base": f"{upstream.base_url}/v1",
            "api_key": UPSTREAM_KEY}, "model_info": {"id": "gpt-a"}},
        moderation_model(upstream.base_url),
    ]
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            model_list=raw_models)
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            yield gateway


def client(gateway: Gateway, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0)


async def test_moderations_pass_to_the_moderation_deployment(
        gw: Gateway, upstream: FakeUpstream) -> None:
    async with admin_client(gw) as api:
        key = (await api.post("/key/generate", {"models": ["text-moderation"]}))["key"]
        chat_only = (await api.post("/key/generate", {"models": ["gpt-test"]}))["key"]
    with trio.fail_after(20):
        flagged = await client(gw, key).moderations.create(
            model="text-moderation", input="I will kill the process")
        # Without a model: the only moderation model configured.
        calm = await client(gw, key).moderations.create(input=["hello", "good day"])
    assert flagged.results[0].flagged is True
    assert flagged.results[0].categories.violence is True
    assert [r.flagged for r in calm.results] == [False, False]
    sent = upstream.requests[-1]
    assert (sent.path, sent.json["model"]) == ("/v1/moderations", "omni-moderation-latest")
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    rows = await spend_rows(gw, 2)
    assert {r.api for r in rows} == {"moderations"} and all(r.input_tokens > 0 for r in rows)
    # Governed as any model: a key without the model may not use it.
    with trio.fail_after(20), pytest.raises(openai.PermissionDeniedError):
        await client(gw, chat_only).moderations.create(model="text-moderation", input="x")


async def test_moderation_and_chat_models_do_not_mix(gw: Gateway) -> None:
    c = client(gw, "sk-test-master")
    with trio.fail_after(20), pytest.raises(openai.BadRequestError) as raised:
        await c.moderations.create(model="gpt-test", input="hello")
    assert "not a moderation model" in str(raised.value)
    with trio.fail_after(20), pytest.raises(openai.BadRequestError) as raised:
        await c.chat.completions.create(
            model="text-moderation", messages=[{"role": "user", "content": "hi"}])
    assert "moderation model" in str(raised.value)
    with trio.fail_after(20), pytest.raises(openai.BadRequestError):
        await c.moderations.create(model="text-moderation", input=[])  # type: ignore[arg-type]


def test_a_moderation_model_must_be_openai_compatible(tmp_path: Path) -> None:
    entry = {"model_name": "mod", "litellm_params": {"model": "anthropic/claude"},
             "model_info": {"mode": "moderation"}}
    with pytest.raises(ConfigError, match="OpenAI-compatible"):
        parse_config({"model_list": [entry]})
