"""The settler against a real server: group commit under concurrency, drain, exact sums."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import MemoryTracer, Settler, open_post_call_batch

if TYPE_CHECKING:
    from triogate.batch import RespBackend

pytestmark = pytest.mark.integration


async def test_many_requests_share_round_trips_and_every_write_lands(redis: RespBackend) -> None:
    tracer = MemoryTracer()
    settler = Settler({"counters": redis}, tracer=tracer)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(settler.run)

            async def request(i: int) -> None:
                async with open_post_call_batch(settler, trace_id=f"r{i}") as post:
                    post.call("INCRBY", keys=["spend"], args=[i], backend="counters",
                              owner="budgets")
                    post.call("HINCRBY", keys=["usage"], args=["requests", 1],
                              backend="counters", owner="routing")

            async with trio.open_nursery() as clients:
                for i in range(200):
                    clients.start_soon(request, i)
            await settler.wait_drained()
            nursery.cancel_scope.cancel()
    stats = settler.statistics()
    assert stats.batches == 200
    assert stats.flushes < 200  # group commit: batches closing during a flush share the next
    assert await redis.execute([("GET", "spend"), ("HGET", "usage", "requests")]) == [
        str(sum(range(200))).encode(), b"200"]
    summary = tracer.summary("r17")
    assert (summary.waits_before, summary.waits_after) == (0, 1)
