"""The response cache through the gateway: hits, streams from cache, controls, scopes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway
from triogate.store import hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

USD = 1_000_000_000
BODY: dict[str, Any] = {"model": "gpt-test", "max_tokens": 30,
                        "messages": [{"role": "user", "content": "cache me"}]}


@pytest.fixture
async def cached(tmp_path: Path, redis: RespBackend, redis_url: str,
                 upstream: FakeUpstream) -> AsyncIterator[tuple[Gateway, str, str]]:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            litellm_settings={"cache": True, "cache_params": {"ttl": 60}})
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            store = gateway.services.store
            assert store is not None
            team = await store.create_team(team_alias="t", rpm_limit=100)
            other = await store.create_team(team_alias="u")
            key, _ = await store.create_key(team_id=team.team_id, max_budget_nanousd=USD,
                                            rpm_limit=100, max_parallel_requests=4)
            outsider, _ = await store.create_key(team_id=other.team_id)
            yield gateway, key, outsider


async def post(gateway: Gateway, key: str, body: dict[str, Any], **headers: str
               ) -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{gateway.openai_base}/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {key}", **headers})
    with trio.fail_after(10):
        await gateway.services.settler.wait_drained()
    return response


async def test_a_hit_is_served_from_cache_with_one_wait_each_side(
    cached: tuple[Gateway, str, str], upstream: FakeUpstream
) -> None:
    gateway, key, _ = cached
    miss = await post(gateway, key, BODY)
    hit = await post(gateway, key, BODY)
    assert (miss.headers["x-triogate-cache"], hit.headers["x-triogate-cache"]) == ("miss", "hit")
    assert hit.json() == miss.json()
    assert len(upstream.requests) == 1
    assert gateway.services.tracer is not None
    summary = gateway.services.tracer.summary(hit.headers["x-triogate-trace-id"])
    assert (summary.waits_before, summary.waits_after) == (1, 1)
    before = {o for r in summary.records if r.phase == "before" for o in r.owners}
    assert "cache" in before
    # It cost nothing, but counted for RPM: the spend log says so.
    assert gateway.services.spend_logs is not None and gateway.services.store is not None
    await gateway.services.spend_logs.wait_drained()
    rows, _ = await gateway.services.store.query_spend_logs()
    by_id = {r.request_id: r for r in rows}
    hit_row = by_id[hit.headers["x-triogate-trace-id"]]
    assert hit_row.cache_hit and hit_row.cost_nanousd == 0 and hit_row.status == "success"
    assert by_id[miss.headers["x-triogate-trace-id"]].cost_nanousd > 0


async def test_a_miss_hashes_the_request_once(
    cached: tuple[Gateway, str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lookup's key goes to the store: the canonical request is hashed once per
    request, and the entry stored under it is the one a second request finds."""
    import triogate.cache.response as response_module

    gateway, key, _ = cached
    calls: list[str] = []
    real = response_module.cache_key

    def counted(*args: Any, **kwargs: Any) -> str:
        calls.append(real(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(response_module, "cache_key", counted)
    body = {**BODY, "messages": [{"role": "user", "content": "hashed once"}]}
    miss = await post(gateway, key, body)
    assert miss.headers["x-triogate-cache"] == "miss"
    assert len(calls) == 1
    hit = await post(gateway, key, body)
    assert hit.headers["x-triogate-cache"] == "hit"
    assert calls == [calls[0], calls[0]]


async def test_a_streaming_request_is_answered_from_cache_as_a_stream(
    cached: tuple[Gateway, str, str], upstream: FakeUpstream
) -> None:
    gateway, key, _ = cached
    first = await post(gateway, key, BODY)
    client = openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0)
    with trio.fail_after(20):
        raw = await client.chat.completions.with_raw_response.create(
            **BODY, stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in raw.parse()]
    assert raw.headers["x-triogate-cache"] == "hit"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.json()["choices"][0]["message"]["content"]
    assert chunks[-1].usage is not None
    assert len(upstream.requests) == 1


async def test_a_streamed_answer_is_cached_for_later_requests(
    cached: tuple[Gateway, str, str], upstream: FakeUpstream
) -> None:
    gateway, key, _ = cached
    streamed = await post(gateway, key, {**BODY, "stream": True})
    assert streamed.headers["x-triogate-cache"] == "miss"
    later = await post(gateway, key, BODY)
    assert later.headers["x-triogate-cache"] == "hit"
    assert later.json()["choices"][0]["message"]["content"]
    assert len(upstream.requests) == 1


async def test_a_streamed_tool_call_is_cached_whole(
    cached: tuple[Gateway, str, str], upstream: FakeUpstream
) -> None:
    """The upstream streams the call's arguments a word at a time (the assembler's
    arguments-only path); a later non-streaming client gets the call whole, as the
    official SDK accumulated it from the stream."""
    gateway, key, _ = cached
    body = {**BODY, "messages": [{"role": "user", "content": "find the weather in Paris "
                                  "and Lyon and Nice and Lille please"}],
            "tools": [{"type": "function", "function": {
                "name": "search", "parameters": {"type": "object", "properties": {}}}}],
            "tool_choice": "required"}
    client = openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0)
    with trio.fail_after(20):
        raw = await client.chat.completions.with_raw_response.create(**body, stream=True)
        pieces: list[str] = []
        call_id = None
        async for chunk in raw.parse():
            for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                call_id = delta_call.id or call_id
                if delta_call.function is not None and delta_call.function.arguments:
                    pieces.append(delta_call.function.arguments)
        await gateway.services.settler.wait_drained()
    assert raw.headers["x-triogate-cache"] == "miss"
    assert len(pieces) > 5  # in pieces indeed
    later = await post(gateway, key, body)
    assert later.headers["x-triogate-cache"] == "hit"
    message = later.json()["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["id"] == call_id and call["function"]["name"] == "search"
    assert call["function"]["arguments"] == "".join(pieces)
    assert json.loads(call["function"]["arguments"])["query"].startswith("find the weather")
    assert later.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert len(upstream.requests) == 1


async def test_cache_controls(cached: tuple[Gateway, str, str], upstream: FakeUpstream) -> None:
    gateway, key, _ = cached
    await post(gateway, key, {**BODY, "cache": {"no-store": True}})
    assert (await post(gateway, key, BODY)).headers["x-triogate-cache"] == "miss"
    assert (await post(gateway, key, BODY)).headers["x-triogate-cache"] == "hit"
    bypass = await post(gateway, key, BODY, **{"cache-control": "no-cache"})
    assert bypass.headers["x-triogate-cache"] == "miss"
    assert len(upstream.requests) == 3
    bad = await post(gateway, key, {**BODY, "cache": {"ttl": -5}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache"


async def test_what_changes_the_output_changes_the_entry(
    cached: tuple[Gateway, str, str], upstream: FakeUpstream
) -> None:
    gateway, key, outsider = cached
    await post(gateway, key, BODY)
    zero = await post(gateway, key, {**BODY, "temperature": 0})
    assert zero.headers["x-triogate-cache"] == "miss"  # omitted temperature is not 0
    other_team = await post(gateway, outsider, BODY)
    assert other_team.headers["x-triogate-cache"] == "miss"  # scope: team
    assert len(upstream.requests) == 3


async def test_a_hit_releases_reservations_and_slots(cached: tuple[Gateway, str, str]) -> None:
    gateway, key, _ = cached
    await post(gateway, key, BODY)
    for _ in range(6):  # more than max_parallel_requests, sequentially
        assert (await post(gateway, key, BODY)).headers["x-triogate-cache"] == "hit"
    backend = gateway.services.backends["counters"]
    keys = await backend.execute([("KEYS", "tg:{key:*}:bud:*")])
    reserved = [await backend.execute([("HGET", k, "reserved")]) for k in keys[0]
                if not k.endswith((b":res", b":exp")) and b":done:" not in k]
    assert reserved and all(r[0] in (b"0", None) for r in reserved)
    slots = f"tg:{{key:{hash_key(key)}}}:rl:par"
    assert await backend.execute([("ZCARD", slots)]) == [0]  # (an empty ZSET is gone)
