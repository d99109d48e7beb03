"""A stream (or a call) longer than ``lease_s`` keeps its reservation and its parallel slot:
its leases are renewed while it runs, so the next request cannot take them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway
from triogate.governance.from_rows import key_principal
from triogate.governance.keys import PARALLEL, budget_keys, rate_window_key

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

USD = 1_000_000_000
LEASE_S = 0.6
BODY = {"model": "gpt-test", "max_tokens": 20,
        "messages": [{"role": "user", "content": "a long story, please"}]}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "call"])
async def test_a_request_longer_than_its_lease_keeps_its_slot_and_reservation(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream, stream: bool
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"governance": {"lease_s": LEASE_S}})
    if stream:
        upstream.chunk_delay_s = 0.25  # a stream of several leases
    else:
        upstream.latency_s = 7 * LEASE_S
    with trio.fail_after(60):
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            assert gw.services.store is not None
            raw, row = await gw.services.store.create_key(
                max_budget_nanousd=10 * USD, max_parallel_requests=1)
            headers = {"authorization": f"Bearer {raw}"}
            principal = key_principal(row)
            slot = rate_window_key("key", principal.id, PARALLEL)
            budget = budget_keys("key", principal.id,
                                 principal.limits.budget_period(gw.services.clock_ms()))
            leases = budget.leases
            during: list[tuple[int, object, object]] = []

            async def second_request() -> None:
                await trio.sleep(4 * LEASE_S)  # well past the first lease's end
                (held_slot, held_lease) = await redis.execute(
                    [("ZCARD", slot), ("ZCARD", leases)])
                answer = await http.post(f"{gw.openai_base}/chat/completions", json=BODY,
                                         headers=headers)
                during.append((answer.status_code, held_slot, held_lease))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(second_request)
                async with http.stream("POST", f"{gw.openai_base}/chat/completions",
                                       json={**BODY, "stream": stream},
                                       headers=headers) as first:
                    lines = [line async for line in first.aiter_lines() if line]
            assert first.status_code == 200, lines
            assert not stream or lines[-1] == "data: [DONE]"
            # While the first ran, its slot and its reservation were still there, so the
            # second request was refused for parallelism (before: admitted after a lease).
            assert during == [(429, 1, 1)]
            await gw.services.settler.wait_drained()
            after = await redis.execute([("ZCARD", slot), ("ZCARD", leases),
                                         ("HGET", budget.counters, "reserved")])
    assert after[:2] == [0, 0]
    assert after[2] in (None, b"0")
