"""A pipeline given up in a partition must not run on Redis when the partition heals.

The client writes ``INCR`` into a link whose packets are dropped (iptables in the Redis
namespace), gives up after its command timeout, and the link heals. Had the client only
closed the socket, the kernel would still retransmit the unacknowledged ``INCR`` and Redis
would run it after the gateway had decided it never ran (for a budget script: a
reservation held until its lease ran out). :class:`RespBackend` resets such a connection
instead, which drops the unsent bytes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import trio

from tests.chaos.harness import redis_binary
from tests.fleet import netns
from tests.fleet.hosts import NsRedis
from triogate.batch import BackendUnavailable, RespBackend

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

WHY_NOT = netns.missing() or (None if redis_binary() else "needs redis-server on PATH")
if WHY_NOT is not None and os.environ.get("TRIOGATE_REQUIRE_FLEET"):
    raise RuntimeError(f"TRIOGATE_REQUIRE_FLEET is set but namespaces cannot be made: {WHY_NOT}")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.fleet,
    pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or ""),
]


@pytest.fixture
def network() -> Iterator[netns.Network]:
    with netns.open_network(["redis"]) as made:
        yield made


async def test_a_timed_out_pipeline_is_not_delivered_after_the_partition(
        tmp_path: Path, network: netns.Network) -> None:
    redis = NsRedis(network, tmp_path / "redis")
    await trio.to_thread.run_sync(redis.start)
    backend = RespBackend(redis.url, command_timeout_s=0.5)
    try:
        assert await backend.execute([("SET", "counter", 0)]) == [b"OK"]
        await trio.to_thread.run_sync(network.cut, "redis", network.gateway_ip)
        with pytest.raises(BackendUnavailable):
            await backend.execute([("INCR", "counter")])
        await trio.sleep(0.3)
        await trio.to_thread.run_sync(network.heal, "redis", network.gateway_ip)
        # TCP would have retransmitted within about a second of the heal (its backoff
        # doubles from 200 ms); wait well past that.
        await trio.sleep(4.0)
        assert await backend.execute([("GET", "counter")]) == [b"0"]
    finally:
        await backend.aclose()
        await trio.to_thread.run_sync(redis.stop)
