"""The settler's group-commit delay as the gateway wires it: post-call writes leave
``post_call_settle_delay_s`` after they were queued, later while requests are in their
pre-call checks (the admission gate's count), never on a drain (issue 13, goal 4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from triogate.batch import post_call_batch
from triogate.batch._settler import BUSY_MAX_DELAYS

if TYPE_CHECKING:
    from triogate.batch import Settler

    from .conftest import Gateway


async def _settle_s(settler: Settler) -> float:
    with post_call_batch(settler, trace_id="t") as post:
        post.call("SET", keys=["tg:test:settle-delay"], args=["1"], owner="test",
                  backend="counters")
    start = trio.current_time()
    with trio.fail_after(5):
        await post.wait_settled()
    return trio.current_time() - start


async def test_post_call_writes_wait_for_requests_in_their_checks(gateway: Gateway) -> None:
    services = gateway.services
    delay_s = services.config.settings.post_call_settle_delay_s
    assert delay_s == 0.005
    idle = await _settle_s(services.settler)
    assert idle >= delay_s * 0.9
    assert await services.gate.enter()  # a request in its pre-call checks
    try:
        busy = await _settle_s(services.settler)
    finally:
        services.gate.leave()
    assert busy >= delay_s * BUSY_MAX_DELAYS * 0.9


async def test_a_drain_does_not_wait_for_the_delay(gateway: Gateway) -> None:
    services = gateway.services
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
