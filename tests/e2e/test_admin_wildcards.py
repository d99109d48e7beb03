"""``/model_group/info`` and ``/v1/models`` expand wildcard groups (``anthropic/*``) into
the models the bundled price table knows for their provider, as LiteLLM does; a key sees
only the names it may use."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway
from tests.e2e.test_admin_api import admin_client
from tests.e2e.test_litellm_models import models
from triogate.routing.models import table_models, table_price

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture
async def gw(tmp_path: Path, redis: RespBackend, redis_url: str,
             upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            model_list=models(upstream.base_url))
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            yield gateway


async def _group_info(gateway: Gateway, key: str, **params: str) -> list[dict[str, object]]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=20) as http:
        with trio.fail_after(20):
            response = await http.get("/model_group/info", params=params,
                                      headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    data: list[dict[str, object]] = response.json()["data"]
    return data


async def test_model_group_info_expands_a_provider_wildcard(gw: Gateway) -> None:
    claude = [f"anthropic/{m.removeprefix('anthropic/')}" for m in table_models({"anthropic"})]
    assert "anthropic/claude-3-haiku" in claude
    entries = {e["model_group"]: e for e in await _group_info(gw, MASTER_KEY)}
    assert entries["anthropic/*"]["is_wildcard"] is True
    for name in claude:
        entry = entries[name]
        assert entry["wildcard_group"] == "anthropic/*" and entry["is_wildcard"] is False
        assert entry["providers"] == ["anthropic"]
    haiku = entries["anthropic/claude-3-haiku"]
    price = table_price("claude-3-haiku")
    assert price.input_usd_per_token > 0
    assert Decimal(str(haiku["input_cost_per_token"])) == price.input_usd_per_token
    # The "*" group expands into the OpenAI models of the table.
    assert "gpt-4o-mini" in entries and entries["gpt-4o-mini"]["wildcard_group"] == "*"
    (one,) = await _group_info(gw, MASTER_KEY, model_group="anthropic/claude-3-haiku")
    assert one["model_group"] == "anthropic/claude-3-haiku"


async def test_a_key_sees_the_expansion_of_the_wildcards_it_may_use(gw: Gateway) -> None:
    async with admin_client(gw) as api:
        key = (await api.post("/key/generate", {"models": ["anthropic/*"]}))["key"]
    names = {e["model_group"] for e in await _group_info(gw, key)}
    assert "anthropic/claude-3-haiku" in names and "anthropic/*" in names
    assert "gpt-test" not in names and "gpt-4o-mini" not in names
    client = openai.AsyncOpenAI(base_url=gw.openai_base, api_key=key, max_retries=0)
    with trio.fail_after(20):
        listed = {m.id async for m in client.models.list()}
    assert "anthropic/claude-3-haiku" in listed and "gpt-4o-mini" not in listed
