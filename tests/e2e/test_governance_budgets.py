"""The proxy-wide budget (``litellm_settings.max_budget``) and per-model budgets
(``model_max_budget`` on keys and teams), over real HTTP with the OpenAI SDK, a real
Redis-compatible server and SQL, bodies as LiteLLM documents them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway
from tests.e2e.test_admin_api import Admin, admin_client, chat

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

#: Less than one request costs: the first request of a period is admitted (it may
#: overshoot by its own cost), every later one is refused.
TINY_USD = "0.0000001"


async def refusal(gateway: Gateway, key: str, model: str = "gpt-test") -> dict[str, Any]:
    """The error of a request that must be refused with 400 (the SDK unwraps ``error``)."""
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(gateway, key, model)
    body = caught.value.body
    assert isinstance(body, dict)
    return body


async def spent_then_refused(gateway: Gateway, key: str, model: str = "gpt-test"
                             ) -> dict[str, Any]:
    """One request served, then (once it is settled) the next refused: its error."""
    assert (await chat(gateway, key, model)).choices
    with trio.fail_after(10):
        await gateway.services.settler.wait_drained()
    return await refusal(gateway, key, model)


@pytest.fixture
async def proxy_budget_gateway(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            litellm_settings={"max_budget": TINY_USD, "budget_duration": "1d"})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


async def test_the_proxy_budget_is_shared_by_every_key(proxy_budget_gateway: Gateway) -> None:
    gateway = proxy_budget_gateway
    async with admin_client(gateway) as api:
        first = (await api.post("/key/generate", {"key_alias": "a"}))["key"]
        second = (await api.post("/key/generate", {"key_alias": "b"}))["key"]
    error = await spent_then_refused(gateway, first)
    assert error["type"] == "budget_exceeded"
    assert error["message"].startswith("Budget has been exceeded! The proxy-wide budget")
    # Another key, with no budget of its own, is refused too: the budget is the proxy's.
    assert "proxy-wide" in (await refusal(gateway, second, "claude-test"))["message"]


async def test_the_proxy_budget_is_refused_with_a_bad_duration(tmp_path: Path) -> None:
    from triogate.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\$\.litellm_settings\.budget_duration"):
        gateway_config(tmp_path, "redis://x", "http://x",
                       litellm_settings={"max_budget": 1, "budget_duration": "soon"})


async def test_a_keys_model_budget_refuses_that_model_only(gateway: Gateway, api: Admin
                                                            ) -> None:
    made = await api.post("/key/generate", {
        "key_alias": "per-model",
        "model_max_budget": {"gpt-test": {"budget_limit": TINY_USD, "time_period": "1d"}}})
    assert made["model_max_budget"] == {"gpt-test": {"budget_limit": 1e-7, "time_period": "1d"}}
    key = made["key"]
    error = await spent_then_refused(gateway, key)
    assert error["type"] == "budget_exceeded"
    assert "Key 'per-model, model gpt-test'" in error["message"]
    # Another model of the same key has no such budget.
    assert (await chat(gateway, key, "claude-test")).choices
    info = (await api.get("/key/info", key=key))["info"]
    assert info["model_max_budget"]["gpt-test"]["time_period"] == "1d"


async def test_a_teams_model_budget_covers_all_its_keys(gateway: Gateway, api: Admin) -> None:
    team = await api.post("/team/new", {
        "team_alias": "eng", "model_max_budget": {"gpt-test": {"budget_limit": TINY_USD}}})
    assert team["model_max_budget"] == {"gpt-test": {"budget_limit": 1e-7, "time_period": None}}
    one = (await api.post("/key/generate", {"team_id": team["team_id"]}))["key"]
    two = (await api.post("/key/generate", {"team_id": team["team_id"]}))["key"]
    await spent_then_refused(gateway, one)
    assert "Team 'eng, model gpt-test'" in (await refusal(gateway, two))["message"]
    assert (await chat(gateway, two, "claude-test")).choices


@pytest.mark.parametrize(("value", "words"), [
    ({"gpt-test": 10}, "budget_limit"),
    ({"gpt-test": {"budget_limit": -1}}, "must not be negative"),
    ({"gpt-test": {"budget_limit": 1, "time_period": "soon"}}, "time_period"),
    ({"gpt-test": {"budget_limit": 1, "period": "1d"}}, "budget_limit"),
    ([1], "must be an object"),
])
async def test_a_malformed_model_budget_is_refused_by_name(api: Admin, value: Any, words: str
                                                           ) -> None:
    error = (await api.post("/key/generate", {"model_max_budget": value}, status=400))["error"]
    assert error["param"].startswith("model_max_budget") and words in error["message"]
    assert (await api.get("/key/list"))["total_count"] == 0
