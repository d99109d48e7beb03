"""LiteLLM's OpenAI-compatible provider names through the gateway: the address and key
come from the provider's variables, the request reaches the server as OpenAI's API."""

from __future__ import annotations

from typing import TYPE_CHECKING

import openai
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway, spend_rows

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


async def test_groq_and_ollama_names_reach_an_openai_compatible_server(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    config = gateway_config(
        tmp_path / "state", redis_url, upstream.base_url,
        environment_variables={"GROQ_API_BASE": f"{upstream.base_url}/v1",
                               "GROQ_API_KEY": "gsk-from-env",
                               "OLLAMA_API_BASE": upstream.base_url},
        model_list=[
            {"model_name": "fast", "litellm_params": {"model": "groq/llama-3.1-8b-instant"}},
            {"model_name": "local", "litellm_params": {
                "model": "ollama_chat/llama3.1", "api_key": "ollama",
                "input_cost_per_token": 0, "output_cost_per_token": 0}},
        ])
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            client = openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY,
                                        max_retries=0)
            fast = await client.chat.completions.create(
                model="fast", messages=[{"role": "user", "content": "hello groq"}])
            groq_request = upstream.requests[-1]
            stream = await client.chat.completions.create(
                model="local", messages=[{"role": "user", "content": "hello ollama"}],
                stream=True)
            assert "".join([c.choices[0].delta.content or "" async for c in stream
                            if c.choices])
            ollama_request = upstream.requests[-1]
            rows = {r.model_group: r for r in await spend_rows(gateway, 2)}
    assert fast.choices[0].message.content
    assert groq_request.path == "/v1/chat/completions"
    assert groq_request.headers["authorization"] == "Bearer gsk-from-env"
    assert groq_request.json["model"] == "llama-3.1-8b-instant"
    assert ollama_request.path == "/v1/chat/completions"  # /v1 added to Ollama's address
    # Groq's listed price: USD 0.05 and 0.08 per million tokens.
    fast_row = rows["fast"]
    assert fast_row.cost_nanousd == round(fast_row.input_tokens * 50
                                          + fast_row.output_tokens * 80) > 0
    assert rows["local"].cost_nanousd == 0
