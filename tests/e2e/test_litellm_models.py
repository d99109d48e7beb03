"""LiteLLM's model-side features through the official SDKs: wildcards, aliases, request
controls, drop_params, context-window fallbacks and the x-litellm-* headers."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import (
    MASTER_KEY,
    UPSTREAM_KEY,
    gateway_config,
    running_gateway,
    traced_waits,
)
from triogate.routing.models import table_price

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

USD = 1_000_000_000
HI = [{"role": "user", "content": "say something short"}]


def models(upstream_url: str) -> list[dict[str, Any]]:
    """The default test groups plus LiteLLM's wildcards."""
    def entry(name: str, model: str, base: str, **extra: Any) -> dict[str, Any]:
        return {"model_name": name, "litellm_params": {
            "model": model, "api_base": base, "api_key": UPSTREAM_KEY, **extra}}
    v1 = f"{upstream_url}/v1"
    price = {"input_cost_per_token": "0.000001", "output_cost_per_token": "0.000002"}
    return [
        {**entry("gpt-test", "openai/gpt-up-a", v1, **price),
         "model_info": {"id": "gpt-a", "access_groups": ["beta-models"]}},
        {**entry("claude-test", "anthropic/claude-up", upstream_url,
                 input_cost_per_token="0.000003", output_cost_per_token="0.000015"),
         "model_info": {"id": "claude"}},
        {**entry("embed-test", "openai/embed-up", v1), "model_info": {"mode": "embedding"}},
        {**entry("anthropic/*", "anthropic/*", upstream_url), "model_info": {"id": "ant-any"}},
        {**entry("*", "openai/*", v1), "model_info": {"id": "openai-any"}},
    ]


@pytest.fixture
async def gw(tmp_path: Path, redis: RespBackend, redis_url: str,
             upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    config = gateway_config(
        tmp_path / "state", redis_url, upstream.base_url,
        model_list=models(upstream.base_url),
        router_settings={"model_group_alias": {"gpt-3.5-turbo-0125": "gpt-test"},
                         "context_window_fallbacks": [{"gpt-test": ["claude-test"]}],
                         "num_retries": 1, "retry_after": 0},
    )
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            yield gateway


def oai(gateway: Gateway, key: str = MASTER_KEY, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0, **kw)


async def test_a_star_deployment_passes_the_model_on_and_prices_it_from_the_table(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    with trio.fail_after(20):
        raw = await oai(gw).chat.completions.with_raw_response.create(
            model="gpt-4o-mini-2024-07-18", messages=HI, max_tokens=20)
    reply = raw.parse()
    assert upstream.requests[-1].path == "/v1/chat/completions"
    assert upstream.requests[-1].json["model"] == "gpt-4o-mini-2024-07-18"
    assert raw.headers["x-litellm-model-group"] == "*"
    assert raw.headers["x-litellm-model-id"] == "openai-any"
    assert reply.usage is not None
    price = table_price("gpt-4o-mini")
    assert price.input_usd_per_token == Decimal("0.00000015")
    expected = price.cost_nanousd(reply.usage.prompt_tokens, reply.usage.completion_tokens)
    assert expected > 0
    assert Decimal(raw.headers["x-litellm-response-cost"]) * USD == expected


async def test_a_provider_wildcard_strips_its_prefix_for_the_anthropic_sdk(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=MASTER_KEY, max_retries=0)
    with trio.fail_after(20):
        message = await client.messages.create(
            model="anthropic/claude-3-5-haiku-20241022", max_tokens=30, messages=HI)
    assert message.content and message.content[0].type == "text"
    sent = upstream.requests[-1]
    assert (sent.path, sent.json["model"]) == ("/v1/messages", "claude-3-5-haiku-20241022")


async def test_an_alias_answers_with_its_group_and_the_list_expands_wildcards(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    with trio.fail_after(20):
        raw = await oai(gw).chat.completions.with_raw_response.create(
            model="gpt-3.5-turbo-0125", messages=HI)
    assert raw.headers["x-litellm-model-group"] == "gpt-test"
    assert upstream.requests[-1].json["model"] == "gpt-up-a"
    listed = {m.id async for m in oai(gw).models.list()}
    assert {"gpt-test", "gpt-3.5-turbo-0125", "gpt-4o-mini", "anthropic/claude-3-haiku"
            } <= listed
    assert "*" not in listed
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.get(f"{gw.openai_base}/models?return_wildcard_routes=true",
                                  headers={"authorization": f"Bearer {MASTER_KEY}"})
    assert {"*", "anthropic/*"} <= {m["id"] for m in response.json()["data"]}


async def test_request_fallbacks_replace_the_configs(gw: Gateway, upstream: FakeUpstream
                                                      ) -> None:
    upstream.fail_next(1, 500)
    before = len(upstream.requests)
    with trio.fail_after(20):
        raw = await oai(gw).chat.completions.with_raw_response.create(
            model="gpt-test", messages=HI,
            extra_body={"fallbacks": ["claude-test"], "num_retries": 0})
    # No retry on gpt-test (num_retries 0): its failure goes straight to the fallback.
    assert [r.path for r in upstream.requests[before:]] == [
        "/v1/chat/completions", "/v1/messages"]
    assert raw.headers["x-litellm-model-group"] == "gpt-test"
    assert raw.headers["x-litellm-model-id"] == "claude"
    assert "fallbacks" not in upstream.requests[-1].json
    with trio.fail_after(20), pytest.raises(openai.BadRequestError) as info:
        await oai(gw).chat.completions.create(
            model="gpt-test", messages=HI, extra_body={"fallbacks": ["no-such-model"]})
    assert info.value.body["param"] == "fallbacks"  # type: ignore[index]
    with trio.fail_after(20), pytest.raises(openai.BadRequestError, match="at most 8"):
        await oai(gw).chat.completions.create(
            model="gpt-test", messages=HI, extra_body={"fallbacks": ["claude-test"] * 9})


async def test_x_litellm_num_retries_zero_gives_up_at_once(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.fail_next(1, 500)
    before = len(upstream.requests)
    with trio.fail_after(20), pytest.raises(openai.InternalServerError):
        await oai(gw).chat.completions.create(
            model="gpt-test", messages=HI, extra_headers={"x-litellm-num-retries": "0"})
    assert len(upstream.requests) - before == 1
    upstream.fail_next(1, 500)
    with trio.fail_after(20):  # the config's one retry
        reply = await oai(gw).chat.completions.create(model="gpt-test", messages=HI)
    assert reply.choices[0].message.content


async def test_x_litellm_timeout_shortens_the_deployments_timeout(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.latency_s = 2.0
    with trio.fail_after(20), pytest.raises(openai.APIStatusError) as info:
        await oai(gw).chat.completions.create(
            model="gpt-test", messages=HI,
            extra_headers={"x-litellm-timeout": "0.2", "x-litellm-num-retries": "0"})
    assert info.value.status_code == 504
    with trio.fail_after(20), pytest.raises(openai.BadRequestError) as bad:
        await oai(gw).chat.completions.create(
            model="gpt-test", messages=HI, extra_body={"timeout": -1})
    assert bad.value.body["param"] == "timeout"  # type: ignore[index]


async def test_a_context_window_error_moves_to_the_context_fallback(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.fail_next(1, 400, message="This model's maximum context length is 8192 tokens")
    with trio.fail_after(20):
        raw = await oai(gw).chat.completions.with_raw_response.create(
            model="gpt-test", messages=HI)
    assert raw.headers["x-litellm-model-id"] == "claude"
    assert upstream.requests[-1].path == "/v1/messages"
    upstream.fail_next(1, 400, message="invalid temperature")
    with trio.fail_after(20), pytest.raises(openai.BadRequestError):
        await oai(gw).chat.completions.create(model="gpt-test", messages=HI)


async def test_drop_params_drops_what_anthropic_cannot_take(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    with trio.fail_after(20), pytest.raises(openai.BadRequestError):
        await oai(gw).chat.completions.create(model="claude-test", messages=HI, n=2)
    with trio.fail_after(20):
        reply = await oai(gw).chat.completions.create(
            model="claude-test", messages=HI, n=2, extra_body={"drop_params": True})
    assert reply.choices[0].message.content
    sent = upstream.requests[-1].json
    assert "n" not in sent and "drop_params" not in sent


async def test_litellm_headers_report_cost_and_key_spend(gw: Gateway) -> None:
    store = gw.services.store
    assert store is not None
    key, _ = await store.create_key(max_budget_nanousd=5 * USD, budget_duration="1d")
    spends = []
    for _ in range(2):
        with trio.fail_after(20):
            raw = await oai(gw, key).chat.completions.with_raw_response.create(
                model="gpt-test", messages=HI)
        with trio.fail_after(10):
            await gw.services.settler.wait_drained()
        assert len(raw.headers["x-litellm-call-id"]) == 32
        assert raw.headers["x-litellm-call-id"] == raw.headers["x-triogate-trace-id"]
        cost = Decimal(raw.headers["x-litellm-response-cost"])
        assert cost > 0
        spends.append((Decimal(raw.headers["x-litellm-key-spend"]), cost))
    # The second request's key spend is the first's plus its own cost.
    assert spends[1][0] == spends[0][0] + spends[1][1]


async def test_wildcard_and_alias_requests_wait_once_before_and_once_after(
    gw: Gateway,
) -> None:
    for model in ("gpt-4o", "gpt-3.5-turbo-0125"):
        async with httpx.AsyncClient(timeout=20) as http:
            response = await http.post(
                f"{gw.openai_base}/chat/completions",
                json={"model": model, "messages": HI},
                headers={"authorization": f"Bearer {MASTER_KEY}"})
        summary = await traced_waits(gw, response)
        assert (summary.waits_before, summary.waits_after) == (1, 1)


async def _admin(gw: Gateway, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{gw.url}{path}", json=body,
                                   headers={"authorization": f"Bearer {MASTER_KEY}"})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def test_key_and_team_aliases_win_over_wildcards_and_wait_as_any_request(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    await _admin(gw, "/team/new", {"team_id": "aliased", "model_aliases": {
        "team-fast": "claude-test", "mistral-7b": "claude-test"}})
    key = (await _admin(gw, "/key/generate", {
        "team_id": "aliased", "models": ["gpt-test", "claude-test"],
        "aliases": {"mistral-7b": "gpt-test", "forbidden": "gpt-4o"}}))["key"]
    # Cold (the key is in no process's memory, nor yet in Redis): the MGET, the row's
    # write-back, then admission in one round. (A key in Redis: the MGET, then admission.)
    first = await oai(gw, key).chat.completions.with_raw_response.create(
        model="mistral-7b", messages=HI)
    assert first.headers["x-litellm-model-group"] == "gpt-test"  # the key's alias wins
    assert upstream.requests[-1].json["model"] == "gpt-up-a"  # not the "*" wildcard's
    with trio.fail_after(10):
        await gw.services.settler.wait_drained()
    assert gw.services.tracer is not None
    summary = gw.services.tracer.summary(first.headers["x-triogate-trace-id"])
    assert (summary.waits_before, summary.waits_after) == (3, 1)
    assert first.headers["x-triogate-redis-waits-before"] == "3"  # the metric's count too
    # Expired in memory, in Redis (the 60 s refresh): the MGET, then admission.
    assert gw.services.identities is not None
    gw.services.identities.expire()
    refreshed = await oai(gw, key).chat.completions.with_raw_response.create(
        model="mistral-7b", messages=HI)
    with trio.fail_after(10):
        await gw.services.settler.wait_drained()
    summary = gw.services.tracer.summary(refreshed.headers["x-triogate-trace-id"])
    assert (summary.waits_before, summary.waits_after) == (2, 1)
    # Warm: the identity is in memory, so the alias costs no wait at all.
    team = await oai(gw, key).chat.completions.with_raw_response.create(
        model="team-fast", messages=HI)
    assert team.headers["x-litellm-model-group"] == "claude-test"
    with trio.fail_after(10):
        await gw.services.settler.wait_drained()
    summary = gw.services.tracer.summary(team.headers["x-triogate-trace-id"])
    assert (summary.waits_before, summary.waits_after) == (1, 1)
    # An alias never widens access: its target must be in the key's models.
    with pytest.raises(openai.PermissionDeniedError):
        await oai(gw, key).chat.completions.create(model="forbidden", messages=HI)
    # Another key has no such alias: the name falls through to the "*" wildcard.
    other = (await _admin(gw, "/key/generate", {}))["key"]
    await oai(gw, other).chat.completions.create(model="mistral-7b", messages=HI)
    assert upstream.requests[-1].json["model"] == "mistral-7b"


async def test_a_callers_alias_is_resolved_in_the_requests_own_task(gw: Gateway) -> None:
    """Finding a caller's alias needs its identity before the body's model is known: that
    lookup runs in the request's task (as admission's does), with no task and no nursery
    of its own, whether it waits (a key not in memory) or not."""
    await _admin(gw, "/team/new", {"team_id": "inline", "model_aliases": {
        "inline-fast": "gpt-test"}})
    key = (await _admin(gw, "/key/generate", {"team_id": "inline",
                                              "models": ["gpt-test"]}))["key"]
    spawned: list[str] = []

    class Spawns(trio.abc.Instrument):
        def task_spawned(self, task: trio.lowlevel.Task) -> None:
            spawned.append(task.name)

    instrument = Spawns()
    trio.lowlevel.add_instrument(instrument)
    try:
        for _ in range(2):  # cold (the lookup waits), then warm
            raw = await oai(gw, key).chat.completions.with_raw_response.create(
                model="inline-fast", messages=HI)
            assert raw.headers["x-litellm-model-group"] == "gpt-test"
    finally:
        trio.lowlevel.remove_instrument(instrument)
    assert not [name for name in spawned if name in ("auth", "batch flush")]


async def test_an_access_group_admits_its_model_groups(gw: Gateway) -> None:
    key = (await _admin(gw, "/key/generate", {"models": ["beta-models"]}))["key"]
    await oai(gw, key).chat.completions.create(model="gpt-test", messages=HI)
    with pytest.raises(openai.PermissionDeniedError):
        await oai(gw, key).chat.completions.create(model="claude-test", messages=HI)
    async with httpx.AsyncClient(timeout=20) as http:
        async def listed(key: str, **params: str) -> list[str]:
            response = await http.get(f"{gw.openai_base}/models", params=params,
                                      headers={"authorization": f"Bearer {key}"})
            assert response.status_code == 200, response.text
            return [m["id"] for m in response.json()["data"]]

        assert await listed(key) == ["gpt-test"]
        assert await listed(key, include_model_access_groups="true") == [
            "gpt-test", "beta-models"]
        assert await listed(key, only_model_access_groups="true") == ["beta-models"]
        other = (await _admin(gw, "/key/generate", {"models": ["claude-test"]}))["key"]
        assert await listed(other, only_model_access_groups="true") == []
