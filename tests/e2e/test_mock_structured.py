"""The mock's structured answers through the gateway, read by the openai and anthropic SDKs
and checked with ``jsonschema``: tool calls whose arguments satisfy the tool's schema and
``response_format`` answers that satisfy theirs, whole and streamed, in every API."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anthropic
import jsonschema
import openai
import pydantic
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

WEATHER = {"type": "object", "additionalProperties": False,
           "properties": {"city": {"type": "string", "minLength": 2},
                          "unit": {"enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7},
                          "at": {"type": "string", "format": "date-time"}},
           "required": ["city", "unit", "days", "at"]}
TOOLS = [{"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "weather in Lyon?"}]


class Step(pydantic.BaseModel):
    explanation: str
    output: str


class Solution(pydantic.BaseModel):
    steps: list[Step]
    final_answer: float = pydantic.Field(ge=10)
    confidence: float | None


def check(value: Any, schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).validate(value)


@pytest.fixture
async def gateway(tmp_path: Path, redis: RespBackend, redis_url: str) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, "http://127.0.0.1:9",
                            model_list=[{"model_name": "mock-gpt",
                                         "litellm_params": {"model": "mock/gpt-mock"}}])
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


def gpt(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY, max_retries=0)


async def test_chat_tool_call_satisfies_the_named_tools_schema(gateway: Gateway) -> None:
    with trio.fail_after(20):
        reply = await gpt(gateway).chat.completions.create(
            model="mock-gpt", messages=ASK, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "weather"}})
        again = await gpt(gateway).chat.completions.create(
            model="mock-gpt", messages=ASK, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "weather"}})
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "weather"
    assert reply.choices[0].finish_reason == "tool_calls"
    check(json.loads(call.function.arguments), WEATHER)
    assert again.choices[0].message.tool_calls == reply.choices[0].message.tool_calls


async def test_streamed_tool_call_and_an_agent_loop_that_ends(gateway: Gateway) -> None:
    weather_only = [TOOLS[1]]
    with trio.fail_after(20):
        stream = await gpt(gateway).chat.completions.create(
            model="mock-gpt", messages=ASK, tools=weather_only, stream=True)
        chunks = [c async for c in stream]
    arguments = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                        for c in chunks if c.choices and c.choices[0].delta.tool_calls)
    check(json.loads(arguments), WEATHER)
    call_id = next(c.choices[0].delta.tool_calls[0].id for c in chunks
                   if c.choices and c.choices[0].delta.tool_calls)
    followed = [*ASK, {"role": "assistant", "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": "weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"}]
    with trio.fail_after(20):
        final = await gpt(gateway).chat.completions.create(
            model="mock-gpt", messages=followed, tools=weather_only)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


async def test_pydantic_structured_output_with_parse(gateway: Gateway) -> None:
    with trio.fail_after(20):
        parsed = await gpt(gateway).chat.completions.parse(
            model="mock-gpt", messages=[{"role": "user", "content": "solve 8x + 7 = -23"}],
            response_format=Solution)
    solution = parsed.choices[0].message.parsed
    assert isinstance(solution, Solution) and solution.final_answer >= 10


async def test_json_schema_and_json_object_answers_streamed(gateway: Gateway) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER,
                                                  "strict": True}}
    with trio.fail_after(20):
        stream = await gpt(gateway).chat.completions.create(
            model="mock-gpt", messages=ASK, response_format=fmt, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        plain = await gpt(gateway).chat.completions.create(
            model="mock-gpt", messages=ASK, response_format={"type": "json_object"})
    check(json.loads(text), WEATHER)
    assert isinstance(json.loads(plain.choices[0].message.content or ""), dict)


async def test_messages_tool_use_plain_and_streamed(gateway: Gateway) -> None:
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=MASTER_KEY, max_retries=0)
    tools = [{"name": "weather", "description": "Weather.", "input_schema": WEATHER}]
    with trio.fail_after(20):
        message = await client.messages.create(
            model="mock-gpt", max_tokens=200, messages=ASK, tools=tools,
            tool_choice={"type": "any"})
        async with client.messages.stream(
            model="mock-gpt", max_tokens=200, messages=ASK, tools=tools,
            tool_choice={"type": "tool", "name": "weather"}) as stream:
            final = await stream.get_final_message()
    for reply in (message, final):
        (use,) = [b for b in reply.content if b.type == "tool_use"]
        assert use.name == "weather" and reply.stop_reason == "tool_use"
        check(use.input, WEATHER)


async def test_responses_function_call_and_text_format(gateway: Gateway) -> None:
    tool = {"type": "function", "name": "weather", "parameters": WEATHER, "strict": True}
    with trio.fail_after(20):
        called = await gpt(gateway).responses.create(
            model="mock-gpt", input="weather in Lyon?", tools=[tool])
        stream = await gpt(gateway).responses.create(
            model="mock-gpt", input="weather in Lyon?", stream=True,
            text={"format": {"type": "json_schema", "name": "w", "schema": WEATHER,
                             "strict": True}})
        events = [e async for e in stream]
    (call,) = [o for o in called.output if o.type == "function_call"]
    assert call.name == "weather"
    check(json.loads(call.arguments), WEATHER)
    done = next(e for e in events if e.type == "response.completed")
    check(json.loads(done.response.output_text), WEATHER)
