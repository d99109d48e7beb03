"""Waits on Redis per request, counted from the tracer's records of real flushes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from tests.e2e.conftest import BOTH_SERVERS, MASTER_KEY, traced_waits

if TYPE_CHECKING:
    from tests.e2e.conftest import Gateway
    from triogate.batch import TraceSummary

pytestmark = [pytest.mark.integration, pytest.mark.e2e, BOTH_SERVERS]

BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "count my waits"}]}


async def traced(gateway: Gateway, body: dict[str, object], key: str = MASTER_KEY
                 ) -> tuple[httpx.Response, TraceSummary]:
    """Send one request, wait for its settlement, return the response and its waits."""
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{gateway.openai_base}/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {key}"})
    with trio.fail_after(10):
        await gateway.drained()
    assert gateway.services.tracer is not None
    return response, gateway.services.tracer.summary(response.headers["x-triogate-trace-id"])


async def test_a_chat_completion_waits_once_before_and_once_after(gateway: Gateway) -> None:
    response, summary = await traced(gateway, BODY)
    assert response.status_code == 200
    assert (summary.waits_before, summary.waits_after) == (1, 1)
    assert response.headers["x-triogate-redis-waits-before"] == "1"
    before = [r for r in summary.records if r.phase == "before"]
    assert {o for r in before for o in r.owners} == {"routing"}


async def test_a_streamed_completion_waits_once_before_and_once_after(gateway: Gateway) -> None:
    response, summary = await traced(gateway, {**BODY, "stream": True})
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    assert (summary.waits_before, summary.waits_after) == (1, 1)


MESSAGES = BODY["messages"]


@pytest.mark.parametrize(("path", "body"), [
    ("/chat/completions", {"model": "gpt-test", "messages": MESSAGES}),
    ("/v1/completions", {"model": "gpt-test", "prompt": "hi"}),
    ("/completions", {"model": "claude-test", "prompt": "hi", "stream": True}),
    ("/embeddings", {"model": "embed-test", "input": "hi"}),
    ("/responses", {"model": "gpt-test", "input": "hi"}),
    ("/openai/deployments/gpt-test/chat/completions?api-version=2024-06-01",
     {"messages": MESSAGES}),
    ("/openai/deployments/embed-test/embeddings", {"input": "hi"}),
])
async def test_every_litellm_route_waits_once_before_and_once_after(
    gateway: Gateway, path: str, body: dict[str, Any]
) -> None:
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{gateway.url}{path}", json=body,
                                   headers={"authorization": f"Bearer {MASTER_KEY}"})
    summary = await traced_waits(gateway, response)
    assert (summary.waits_before, summary.waits_after) == (1, 1)
