"""What the cloud providers' end-to-end tests share (Gemini, Vertex AI, Bedrock, Azure)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import trio

from tests.e2e.conftest import MASTER_HEADERS, MASTER_KEY, traced_waits
from triogate.config import parse_config

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.config import GatewayConfig

#: A 1x1 PNG.
PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
           "RU5ErkJggg==")
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
USD = 1_000_000_000


def cloud_config(tmp_path: Path, redis_url: str, models: list[dict[str, Any]]) -> GatewayConfig:
    """A gateway serving ``models`` only, with the test defaults (tracing on)."""
    return parse_config({
        "model_list": models,
        "router_settings": {"num_retries": 0, "allowed_fails": 2, "cooldown_time": 60},
        "general_settings": {"master_key": MASTER_KEY},
        "triogate": {"state_dir": str(tmp_path / "state"), "tracing": True,
                     "redis": {"url": redis_url, "timeout_s": 2.0}, "shutdown_grace_s": 5}})


def oai(gateway: Gateway) -> openai.AsyncOpenAI:
    """The openai SDK on the gateway, with the master key and no retries."""
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY, max_retries=0)


def claude(gateway: Gateway) -> anthropic.AsyncAnthropic:
    """The anthropic SDK on the gateway, with the master key and no retries."""
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key=MASTER_KEY, max_retries=0)


def error_of(response: httpx.Response, *, anthropic_shape: bool, secret: str
             ) -> dict[str, Any]:
    """The error object of an OpenAI- or Anthropic-shaped error answer, checked clean
    (no stack trace, not the upstream ``secret``)."""
    payload = response.json()
    if anthropic_shape:
        assert payload["type"] == "error"
    assert secret and "Traceback" not in response.text and secret not in response.text
    error: dict[str, Any] = payload["error"]
    return error


async def streamed_tool_calls(gateway_url: str, model: str) -> None:
    """A messages stream and a responses stream that each end in a tool call, through
    the anthropic and openai SDKs: the tool's name and arguments arrive whole."""
    client = anthropic.AsyncAnthropic(base_url=gateway_url, api_key=MASTER_KEY, max_retries=0)
    schema = TOOL["function"]["parameters"]  # type: ignore[index]
    with trio.fail_after(30):
        async with client.messages.stream(
            model=model, max_tokens=64, tool_choice={"type": "any"},
            tools=[{"name": "get_weather", "input_schema": schema}],
            messages=[{"role": "user", "content": "weather in Bern"}]) as stream:
            final = await stream.get_final_message()
        responses = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key=MASTER_KEY,
                                       max_retries=0).responses
        events = [e async for e in await responses.create(
            model=model, input="weather in Kyiv", stream=True, tool_choice="required",
            tools=[{"type": "function", "name": "get_weather", "parameters": schema}])]
    assert final.stop_reason == "tool_use"
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input == {"query": "weather in Bern"}
    done = events[-1]
    assert done.type == "response.completed"
    (call,) = [item for item in done.response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.arguments == '{"query":"weather in Kyiv"}'


async def post(gateway: Gateway, path: str, body: dict[str, Any]) -> httpx.Response:
    """``body`` posted to ``path`` of the gateway with the master key."""
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=20) as http:
            return await http.post(f"{gateway.url}{path}", json=body, headers=MASTER_HEADERS)


def check_error(response: httpx.Response, path: str, secret: str,
                expected: tuple[int, str, str]) -> None:
    """The answer is an error in the shape ``path`` speaks, with ``expected``'s status,
    type and words, and does not show ``secret``."""
    error = error_of(response, anthropic_shape=path == "/v1/messages", secret=secret)
    assert (response.status_code, error["type"]) == expected[:2]
    assert expected[2] in error["message"]


async def throttled_until_cooled_down(gateway: Gateway, body: dict[str, Any], route: str,
                                      deployment: str) -> None:
    """Four chat calls against an upstream that only throttles: the first two reach it
    (allowed_fails=2) and are 429s, then the deployment is cooled down in Redis."""
    statuses = [(await post(gateway, "/v1/chat/completions", body)).status_code
                for _ in range(4)]
    assert statuses[:2] == [429, 429]
    assert all(s in (429, 503) for s in statuses)
    with trio.fail_after(10):
        await gateway.services.settler.wait_drained()
    cooldown = await gateway.services.backends["counters"].execute(
        [("HGET", f"tg:{{rt:{route}}}:cooldown", deployment)])
    assert cooldown[0] is not None


async def governed_waits(gateway: Gateway, model: str, *, embedding: bool) -> None:
    """Every shape of a governed request to ``model`` (chat, chat stream, messages; or
    embeddings) waits on Redis once before the call and once after."""
    store = gateway.services.store
    assert store is not None
    team = await store.create_team(team_alias="ml", max_budget_nanousd=100 * USD,
                                   budget_duration="30d", tpm_limit=1_000_000, rpm_limit=1000)
    key, _ = await store.create_key(team_id=team.team_id, max_budget_nanousd=10 * USD,
                                    budget_duration="1d", tpm_limit=100_000, rpm_limit=100)
    if embedding:
        shapes = [("/v1/embeddings", {"model": model, "input": "count my waits"})]
    else:
        body = {"model": model, "messages": [{"role": "user", "content": "count my waits"}]}
        shapes = [("/v1/chat/completions", {**body, "stream": s}) for s in (False, True)]
        shapes.append(("/v1/messages", {**body, "max_tokens": 16}))
    async with httpx.AsyncClient(timeout=20) as http:
        for i, (path, body) in enumerate([shapes[0], *shapes]):  # the first warms the key
            with trio.fail_after(20):
                response = await http.post(f"{gateway.url}{path}", json=body,
                                           headers={"authorization": f"Bearer {key}"})
            summary = await traced_waits(gateway, response)
            if i:
                assert (summary.waits_before, summary.waits_after) == (1, 1), path
