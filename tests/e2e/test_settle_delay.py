"""The settler's group-commit delay as the gateway wires it: post-call writes leave
``post_call_settle_delay_s`` after they were queued, later while requests are in their
pre-call checks (the admission gate's count), never on a drain (issue 13, goal 4). Off
by default: a parallel-request slot must be given back before the client's next request
(``test_bad_input.py`` sends one at once with ``max_parallel_requests: 1``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import post_call_batch
from triogate.batch._settler import BUSY_MAX_DELAYS

from .conftest import gateway_config, running_gateway

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


async def test_the_delay_is_off_by_default(gateway: Gateway) -> None:
    assert gateway.services.config.settings.post_call_settle_delay_s == 0


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


async def test_a_drain_does_not_wait_for_the_delay(delayed: Gateway) -> None:
    services = delayed.services
    assert await services.gate.enter()
    try:
        with post_call_batch(services.settler, trace_id="t") as post:
            post.call("SET", keys=["tg:test:settle-delay"], args=["1"], owner="test",
                  backend="counters")
        start = trio.current_time()
        with trio.fail_after(5):
            await services.settler.wait_drained()
        assert trio.current_time() - start < services.config.settings.post_call_settle_delay_s
    finally:
        services.gate.leave()
