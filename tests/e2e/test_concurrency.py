"""Correctness under concurrency, through running gateways on a real Redis.

* 200 concurrent requests on a key whose budget covers 50: at most 50 are admitted,
  the recorded spend is the exact sum of the actual costs, nothing stays reserved.
* Two gateways (separate clients, caches and routers, as two processes) sharing one
  Redis and one database enforce one RPM limit and one max_parallel_requests together.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway
from triogate.batch import open_batch_scope
from triogate.governance.budgets import budget_state
from triogate.governance.from_rows import key_principal

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

#: Below the fake upstream's natural reply length, so it stops at exactly MAX_TOKENS:
#: with output-only prices every request's estimate equals its actual cost.
MAX_TOKENS = 5
#: Output tokens only, so a request's estimate is exactly MAX_TOKENS × price.
PRICED = {"input_cost_per_token": "0", "output_cost_per_token": "0.000001"}
BODY: dict[str, Any] = {"model": "gpt-test", "max_tokens": MAX_TOKENS,
                        "messages": [{"role": "user", "content": "race"}]}


def priced_config(state: Path, redis_url: str, upstream_url: str, **extra: Any) -> Any:
    config = gateway_config(state, redis_url, upstream_url, **extra)
    raw_models = []
    for d in config.deployments:  # rebuild with output-only prices
        raw_models.append({"model_name": d.group, "model_info": {"id": d.id, "mode": d.mode},
                           "litellm_params": {"model": f"{d.provider}/{d.upstream_model}",
                                              "api_base": d.api_base, "api_key": d.api_key,
                                              **PRICED}})
    return gateway_config(state, redis_url, upstream_url, model_list=raw_models, **extra)


async def burst(url: str, key: str, n: int) -> list[httpx.Response]:
    responses: list[httpx.Response] = []
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def one() -> None:
            responses.append(await http.post(f"{url}/v1/chat/completions", json=BODY,
                                             headers={"authorization": f"Bearer {key}"}))

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
    return responses


async def test_a_budget_for_50_admits_at_most_50_of_200_and_sums_exactly(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    config = priced_config(tmp_path / "state", redis_url, upstream.base_url)
    estimate = MAX_TOKENS * 1000  # nano-USD: 5 output tokens at 1000 nano-USD each
    upstream.latency_s = 0.5  # all 200 in flight together
    with trio.fail_after(120):
        async with running_gateway(config) as gateway:
            store = gateway.services.store
            assert store is not None
            key, row = await store.create_key(max_budget_nanousd=50 * estimate)
            responses = await burst(gateway.url, key, 200)
            await gateway.services.settler.wait_drained()
            await gateway.services.spend_logs.wait_drained()  # type: ignore[union-attr]
            ok = [r for r in responses if r.status_code == 200]
            refused = [r for r in responses if r.status_code != 200]
            assert len(ok) == 50  # estimates are exact here: the budget is used to the end
            assert {r.json()["error"]["type"] for r in refused} == {"budget_exceeded"}
            logs, _ = await store.query_spend_logs(key_hash=row.token_hash, size=1000)
            async with httpx.AsyncClient() as http:
                reported = (await http.get(
                    f"{gateway.url}/spend/logs/v2", params={"key_hash": row.token_hash},
                    headers={"authorization": f"Bearer {MASTER_KEY}"})).json()
            charged = sum(r.cost_nanousd for r in logs if r.status == "success")
            assert len([r for r in logs if r.status == "success"]) == len(ok)
            async with open_batch_scope(gateway.services.backends) as scope:
                state = scope.start_participant(partial(
                    budget_state, scope.batch, key_principal(row),
                    now_ms=gateway.services.clock_ms()))
    assert state.result().spend_nanousd == charged  # exact integers
    assert state.result().reserved_nanousd == 0
    assert reported["totals"]["spend_nanousd"] == charged  # /spend/logs agrees with Redis
    assert reported["total"] == 200


async def test_two_gateways_enforce_one_rpm_and_one_parallel_limit(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    shared_db = {"general_settings": {"database_url": f"sqlite:///{tmp_path}/shared.db"}}
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            gateways: list[Gateway] = [
                await stack.enter_async_context(running_gateway(gateway_config(
                    tmp_path / f"state-{i}", redis_url, upstream.base_url, **shared_db)))
                for i in range(2)
            ]
            store = gateways[0].services.store
            assert store is not None
            rpm_key, _ = await store.create_key(rpm_limit=100)
            results: list[httpx.Response] = []
            async with trio.open_nursery() as nursery:
                for gateway in gateways:

                    async def run(url: str = gateway.url) -> None:
                        results.extend(await burst(url, rpm_key, 150))

                    nursery.start_soon(run)
            admitted = sum(r.status_code == 200 for r in results)
            assert 99 <= admitted <= 101  # within 1% of the shared limit
            limited = [r for r in results if r.status_code == 429]
            assert limited and all("retry-after" in r.headers for r in limited)
            assert {r.headers["x-ratelimit-limit-requests"] for r in limited} == {"100"}

            upstream.latency_s = 1.0  # requests stay in flight for a second
            par_key, _ = await store.create_key(max_parallel_requests=5)
            results = []
            async with trio.open_nursery() as nursery:
                for gateway in gateways:

                    async def run_parallel(url: str = gateway.url) -> None:
                        results.extend(await burst(url, par_key, 20))

                    nursery.start_soon(run_parallel)
            assert sum(r.status_code == 200 for r in results) == 5
            assert sum(r.status_code == 429 for r in results) == 35
