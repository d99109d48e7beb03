"""What the cloud providers' end-to-end tests share (Gemini, Vertex AI, Bedrock)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.e2e.conftest import MASTER_KEY
from triogate.config import parse_config

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

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
    import anthropic
    import openai
    import trio

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
