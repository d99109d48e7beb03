"""The settler's group-commit delay as the gateway wires it: post-call writes leave
``post_call_settle_delay_s`` after they were queued, later while requests are in their
pre-call checks (the admission gate's count), never on a drain, and
at once when they give back a parallel-request slot, which the client's next request may
need as soon as it has its answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from triogate.batch import post_call_batch
from triogate.batch._settler import BUSY_MAX_DELAYS

from .conftest import gateway_config, running_gateway, short_request

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from triogate.batch import Settler
    from triogate.testing.fakeupstream import FakeUpstream

    from .conftest import Gateway

DELAY_S = 0.005


@pytest.fixture
async def delayed(tmp_path: Path, redis_url: str, upstream: FakeUpstream,
                  redis: object) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"post_call_settle_delay_s": DELAY_S})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


async def test_the_delay_is_on_by_default(gateway: Gateway) -> None:
    assert gateway.services.config.settings.post_call_settle_delay_s == 0.005


async def test_a_parallel_slot_is_back_before_the_next_request(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream, redis: object,
) -> None:
    """With a long delay, a key with one parallel slot still sends request after request
    at once: the settlement that gives the slot back does not wait for the delay."""
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"post_call_settle_delay_s": 5.0})
    with trio.fail_after(60):
        async with running_gateway(config) as gw, httpx.AsyncClient(
                base_url=gw.url, timeout=20) as http:
            assert gw.services.store is not None
            key, _ = await gw.services.store.create_key(max_parallel_requests=1)
            for i in range(5):
                response = await http.post(
                    "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                    json=short_request("chat", f"hi {i}"))
                assert response.status_code == 200, response.text


async def _settle_s(settler: Settler) -> float:
    with post_call_batch(settler, trace_id="t") as post:
        post.call("SET", keys=["tg:test:settle-delay"], args=["1"], owner="test",
                  backend="counters")
    start = trio.current_time()
    with trio.fail_after(5):
        await post.wait_settled()
    return trio.current_time() - start


async def test_post_call_writes_wait_for_requests_in_their_checks(delayed: Gateway) -> None:
    services = delayed.services
    delay_s = services.config.settings.post_call_settle_delay_s
    assert delay_s == DELAY_S
    idle = await _settle_s(services.settler)
    assert idle >= delay_s * 0.9
    assert await services.gate.enter()  # a request in its pre-call checks
    try:
        busy = await _settle_s(services.settler)
    finally:
        services.gate.leave()
    assert busy >= delay_s * BUSY_MAX_DELAYS * 0.9


async def test_a_drain_does_not_wait_for_the_delay(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream, redis: object,
) -> None:
    """A long delay, so that the bound holds on a loaded host: a drain sends what is
    queued at once, even while a request is in its checks (which would stretch the
    delay)."""
    delay_s = 5.0
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"post_call_settle_delay_s": delay_s})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            services = gw.services
            assert await services.gate.enter()
            try:
                with post_call_batch(services.settler, trace_id="t") as post:
                    post.call("SET", keys=["tg:test:settle-delay"], args=["1"],
                              owner="test", backend="counters")
                start = trio.current_time()
                await services.settler.wait_drained()
                assert trio.current_time() - start < delay_s / 2
                with trio.fail_after(1):  # drained: its batch is settled already
                    await post.wait_settled()
            finally:
                services.gate.leave()
