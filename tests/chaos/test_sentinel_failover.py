"""Money stays exact through a Sentinel failover, with two gateway processes under load.

Two ``triogate serve`` processes reach Redis through a sentinel (``redis+sentinel://``,
``wait_replicas: 2``): a primary, two replicas, one sentinel. Under continuous load:

1. a planned failover (``SENTINEL FAILOVER``): a replica is promoted; the old primary
   lives on and is made a replica some seconds later. Writes it took meanwhile cannot be
   acknowledged by two replicas, fail, are journaled, and are replayed to the new primary;
2. the new primary is killed (-9), the sentinel promotes a replica, and the dead node is
   replaced by an empty server joining as a replica.

Afterwards, on the primary the sentinel names, every key's, team's and end user's spend
equals the sum of its spend-log rows to the nano-dollar, and nothing stays reserved.

Why every replica must acknowledge: replication is asynchronous, and during a failover
the old primary keeps taking writes (and a replica still following it keeps
acknowledging them) until the sentinel reconfigures both; those writes vanish when they
resync from the new primary. A write counts as done only once every replica has it, so
none can vanish that way; a write that cannot get there is journaled and replayed.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio

from tests.chaos.harness import (
    GatewayProcess,
    LoadStats,
    client_loop,
    create_principals,
    money_check,
    write_config,
)
from tests.integration.sentinel_server import LocalSentinel
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

CLIENTS = 6


async def test_money_is_exact_through_sentinel_failovers(tmp_path: Path) -> None:
    pair = await trio.to_thread.run_sync(partial(LocalSentinel, tmp_path / "redis",
                                                  replicas=2))
    database = tmp_path / "spend.db"
    gateways: list[GatewayProcess] = []
    faults: list[str] = []
    try:
        async with open_fake_upstream() as upstream:
            for i in range(2):
                config = tmp_path / f"gateway-{i}.yaml"
                write_config(config, state=tmp_path / f"state-{i}", redis_url=pair.url,
                             database=database, upstream_url=upstream.base_url,
                             redis={"wait_replicas": 2})
                gateways.append(GatewayProcess(config, tmp_path / f"gateway-{i}.log"))
            with trio.fail_after(200):
                for gateway in gateways:
                    await gateway.wait_ready()
                made = await create_principals(gateways[0].url)
                stats = LoadStats()
                stop = trio.Event()
                async with trio.open_nursery() as nursery:
                    for c in range(CLIENTS):
                        nursery.start_soon(partial(client_loop, [g.url for g in gateways],
                                                   made, stats, stop, seed=c))
                    await trio.sleep(2.0)
                    old = pair.primary
                    await trio.to_thread.run_sync(pair.failover)
                    second = await trio.to_thread.run_sync(pair.wait_failover)
                    faults.append("planned failover")
                    # The sentinel makes the old primary a replica some seconds later;
                    # until then writes cannot reach both replicas, fail, and are journaled.
                    await trio.to_thread.run_sync(pair.wait_rejoined, old)
                    await trio.sleep(1.0)
                    await trio.to_thread.run_sync(pair.kill, second)
                    faults.append("primary killed")
                    third = await trio.to_thread.run_sync(
                        partial(pair.wait_failover, second, timeout_s=40))
                    # The dead node is replaced (an empty server joining as a replica):
                    # until then writes reach one replica of two, and wait.
                    await trio.sleep(1.0)
                    await trio.to_thread.run_sync(
                        partial(pair.start_server, second, replica_of=third))
                    faults.append("dead node replaced")
                    await trio.sleep(3.0)
                    stop.set()
                bodies = [await g.wait_settled(timeout_s=60) for g in gateways]
                codes = [await g.stop() for g in gateways]
                named = await trio.to_thread.run_sync(pair.named_primary)
                primary_url = f"redis://127.0.0.1:{named}"
                report = await money_check(primary_url, database, made)
    finally:
        for gateway in gateways:
            gateway.kill()
        await trio.to_thread.run_sync(pair.stop)
    answered = sum(stats.statuses.values())
    print(f"\nrequests sent {stats.sent}, answered {answered} {dict(stats.statuses)}, "
          f"transport errors {stats.transport_errors}; faults: {'; '.join(faults)}")
    print(f"spend-log rows {report.rows}, spend {report.spend_nanousd} nano-USD, "
          f"discrepancies {len(report.discrepancies)}")
    for line in report.discrepancies:
        print("  " + line)
    assert codes == [0, 0]
    assert stats.transport_errors == 0 and answered == stats.sent
    assert report.rows == answered
    assert report.spend_nanousd > 0
    assert report.discrepancies == []
    assert all(b["redis"] == "connected" for b in bodies)
