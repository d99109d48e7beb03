"""Streaming accounting: usage always asked for, counted when absent, and a client that
goes away mid-stream is charged what was produced, with nothing left reserved."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway, spend_rows
from triogate.batch import open_batch_scope
from triogate.governance.budgets import budget_state
from triogate.store import hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.store import SpendLogRow
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

USD = 1_000_000_000
BODY = {"model": "gpt-test", "stream": True, "max_tokens": 200,
        "messages": [{"role": "user", "content": "tell me a long story " * 5}]}


@pytest.fixture
async def budgeted(tmp_path: Path, redis: RespBackend, redis_url: str,
                   upstream: FakeUpstream) -> AsyncIterator[tuple[Gateway, str]]:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url)
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            assert gateway.services.store is not None
            raw, _ = await gateway.services.store.create_key(
                max_budget_nanousd=10 * USD, max_parallel_requests=5, tpm_limit=1_000_000)
            yield gateway, raw


async def key_budget(gateway: Gateway, raw: str) -> tuple[int, int]:
    """(spend, reserved) of the key in nano-USD, from Redis."""
    identities = gateway.services.identities
    assert identities is not None
    async with open_batch_scope(gateway.services.backends) as scope:
        row = await gateway.services.store.get_keys([hash_key(raw)])  # type: ignore[union-attr]
        from triogate.governance.from_rows import key_principal

        principal = key_principal(row[hash_key(raw)])
        state = scope.start_participant(
            lambda: budget_state(scope.batch, principal, now_ms=gateway.services.clock_ms()))
    result = state.result()
    return result.spend_nanousd, result.reserved_nanousd


async def spend_row(gateway: Gateway) -> SpendLogRow:
    (row,) = await spend_rows(gateway, 1)
    return row


async def test_usage_is_always_asked_of_openai_upstreams(
    budgeted: tuple[Gateway, str], upstream: FakeUpstream
) -> None:
    gateway, key = budgeted
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{gateway.openai_base}/chat/completions", json=BODY,
                                    headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 200
    assert upstream.requests[-1].json["stream_options"] == {"include_usage": True}
    chunks = [orjson.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: {")]
    assert not any(c.get("usage") for c in chunks)  # the client did not ask for it
    row = await spend_row(gateway)
    assert row.output_tokens > 0 and row.cost_nanousd > 0 and row.status == "success"
    spend, reserved = await key_budget(gateway, key)
    assert (spend, reserved) == (row.cost_nanousd, 0)


async def test_a_stream_without_usage_is_counted(
    budgeted: tuple[Gateway, str], upstream: FakeUpstream
) -> None:
    gateway, key = budgeted
    upstream.omit_stream_usage = True
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{gateway.openai_base}/chat/completions", json=BODY,
                                   headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 200
    row = await spend_row(gateway)
    assert row.output_tokens > 0 and row.input_tokens > 0 and row.cost_nanousd > 0
    spend, reserved = await key_budget(gateway, key)
    assert (spend, reserved) == (row.cost_nanousd, 0)


async def test_a_client_gone_mid_stream_is_charged_what_was_produced(
    budgeted: tuple[Gateway, str], upstream: FakeUpstream
) -> None:
    gateway, key = budgeted
    upstream.chunk_delay_s = 0.05
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=20) as http, http.stream(
            "POST", f"{gateway.openai_base}/chat/completions", json=BODY,
            headers={"authorization": f"Bearer {key}"},
        ) as response:
            seen = 0
            async for line in response.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 3:
                    break  # the client goes away
        await upstream.wait_disconnects(1)  # the gateway dropped the upstream stream too
    row = await spend_row(gateway)
    assert row.status == "cancelled"
    assert row.output_tokens > 0 and row.cost_nanousd > 0
    spend, reserved = await key_budget(gateway, key)
    assert spend == row.cost_nanousd
    assert reserved == 0  # nothing stays reserved
    parallel = await gateway.services.backends["counters"].execute(
        [("ZCARD", f"tg:{{key:{hash_key(key)}}}:rl:par")])
    assert parallel == [0]  # the parallel slot was released
