"""Redis killed and restarted under load, through a running gateway: fail-open decides
from local state and says so; fail-closed refuses with 503; nothing is lost."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from pathlib import Path

    from tests.chaos.conftest import KillableServer

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

USD = 1_000_000_000
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "during an outage"}]}


async def load(url: str, key: str, results: list[httpx.Response], stop: trio.Event) -> None:
    """Four clients sending requests back to back until ``stop``."""
    async def client() -> None:
        async with httpx.AsyncClient(timeout=20) as http:
            while not stop.is_set():
                results.append(await http.post(
                    f"{url}/v1/chat/completions", json=BODY,
                    headers={"authorization": f"Bearer {key}"}))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(client)


async def wait_recovered(url: str, timeout_s: float = 15) -> None:
    """Until the gateway reaches Redis again and its journal is replayed (readiness says so):
    a poll with a deadline, not a guess at how long recovery takes."""
    with trio.fail_after(timeout_s):
        async with httpx.AsyncClient(timeout=5) as http:
            while True:
                body = (await http.get(f"{url}/health/readiness")).json()
                if body["redis"] == "connected" and not body["settler"]["journal_pending"]:
                    return
                await trio.sleep(0.05)


@pytest.mark.parametrize("budget_policy", ["fail-open", "fail-closed"])
async def test_killing_and_restarting_redis_under_load(
    tmp_path: Path, killable_server: KillableServer, budget_policy: str
) -> None:
    async with open_fake_upstream() as upstream:
        config = gateway_config(
            tmp_path / "state", killable_server.url, upstream.base_url,
            triogate={"redis": {"timeout_s": 0.3},
                      "policies": {"budgets": budget_policy, "rate_limits": "fail-open"}})
        with trio.fail_after(90):
            async with running_gateway(config) as gateway:
                store = gateway.services.store
                assert store is not None
                key, _ = await store.create_key(max_budget_nanousd=100 * USD, rpm_limit=10_000)
                before: list[httpx.Response] = []
                during: list[httpx.Response] = []
                after: list[httpx.Response] = []
                for phase, seconds in ((before, 0.5), (during, 1.5), (after, 0.5)):
                    if phase is during:
                        killable_server.kill()
                    if phase is after:
                        await killable_server.restart()
                        await wait_recovered(gateway.url)
                    stop = trio.Event()
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(load, gateway.url, key, phase, stop)
                        await trio.sleep(seconds)
                        stop.set()
                    if phase is during:
                        async with httpx.AsyncClient() as http:
                            ready = (await http.get(f"{gateway.url}/health/readiness")).json()
                        assert ready["status"] == "degraded"
                        assert ready["redis"].startswith("unavailable")

                assert before and during and after
                assert all(r.status_code == 200 for r in before)
                assert not any("x-triogate-degraded" in r.headers for r in before)
                if budget_policy == "fail-open":
                    assert all(r.status_code == 200 for r in during)
                    assert all(r.headers["x-triogate-degraded"] == "redis" for r in during)
                else:
                    assert all(r.status_code == 503 for r in during)
                    assert {r.json()["error"]["type"] for r in during} == {"service_unavailable"}
                # Recovered: decisions come from Redis again.
                assert all(r.status_code == 200 for r in after)
                assert not any("x-triogate-degraded" in r.headers for r in after)
                stats = gateway.services.settler.statistics()
                assert stats.journaled > 0 and stats.journal_pending == 0
                metrics = gateway.services.metrics.render().decode()
                assert 'triogate_degraded_decisions_total{check="budgets"}' in metrics


async def test_a_paused_redis_costs_the_timeout_and_the_gateway_keeps_serving(
    tmp_path: Path, killable_server: KillableServer
) -> None:
    async with open_fake_upstream() as upstream:
        config = gateway_config(tmp_path / "state", killable_server.url, upstream.base_url,
                                triogate={"redis": {"timeout_s": 0.3}})
        with trio.fail_after(60):
            async with running_gateway(config) as gateway:
                key, _ = await gateway.services.store.create_key(  # type: ignore[union-attr]
                    rpm_limit=100)
                async with httpx.AsyncClient(timeout=20) as http:
                    warm = await http.post(f"{gateway.openai_base}/chat/completions",
                                           json=BODY, headers={"authorization": f"Bearer {key}"})
                    assert warm.status_code == 200
                    killable_server.pause()
                    try:
                        started = trio.current_time()
                        paused = await http.post(f"{gateway.openai_base}/chat/completions",
                                                 json=BODY,
                                                 headers={"authorization": f"Bearer {key}"})
                        elapsed = trio.current_time() - started
                    finally:
                        killable_server.resume()
                assert paused.status_code == 200
                assert paused.headers["x-triogate-degraded"] == "redis"
                assert elapsed < 3  # one bounded wait, not a hang
