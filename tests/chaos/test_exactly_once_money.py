"""Exactly-once money under Redis faults, through two gateway processes.

Two ``python -m triogate serve`` processes share one redis-server (AOF, ``appendfsync
always``) and one database (SQLite, or a PostgreSQL cluster of the test's own), under
continuous load (chats and streams, random keys, teams and end users). Meanwhile the test
kills every client connection, pauses Redis (SIGSTOP) and resumes it, kills it (-9) and
restarts it, and restarts it with a data set that keeps it answering LOADING for about
two seconds; with PostgreSQL it also crashes the database (``pg_ctl -m immediate``) and
starts it again 1.5 s later. Afterwards, for every key, team and end user, the spend in
Redis equals the sum of the spend-log rows to the nano-dollar, and nothing stays
reserved, held or leased.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio

from tests.chaos.harness import (
    AofRedis,
    GatewayProcess,
    LoadStats,
    PrivatePostgres,
    client_loop,
    create_principals,
    money_check,
    pad_and_rewrite,
    postgres_binaries,
    redis_binary,
    wait_loaded,
    write_config,
)
from triogate.batch import RespBackend
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.skipif(redis_binary() is None, reason="needs redis-server on PATH"),
]

CLIENTS = 8


async def inject_faults(redis: AofRedis, faults: list[str],
                        postgres: PrivatePostgres | None = None) -> None:
    """The fault schedule, about 15 s (18 s with PostgreSQL); each fault followed by a
    stretch of normal load."""
    admin = RespBackend(redis.url, command_timeout_s=5)
    try:
        await trio.sleep(1.5)
        await admin.execute([("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")])
        faults.append("client kill")
        await trio.sleep(1.0)

        redis.pause()
        faults.append("SIGSTOP 1.5 s")
        await trio.sleep(1.5)
        redis.resume()
        await trio.sleep(1.0)

        redis.kill()
        faults.append("kill -9, down 1.5 s, restart")
        await trio.sleep(1.5)
        await redis.start()
        await wait_loaded(admin)
        await trio.sleep(1.0)

        await pad_and_rewrite(admin)
        redis.kill()
        await redis.start(slow_load=True)
        loading_s = await wait_loaded(admin)
        faults.append(f"kill -9, restart answering LOADING for {loading_s:.1f} s")
        assert loading_s > 0.5
        await trio.sleep(1.0)

        await admin.execute([("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")])
        faults.append("client kill")
        await trio.sleep(1.0)

        if postgres is not None:
            await trio.to_thread.run_sync(postgres.crash)
            faults.append("PostgreSQL crashed (immediate stop), down 1.5 s, restarted")
            await trio.sleep(1.5)
            await trio.to_thread.run_sync(postgres.start)
            await trio.sleep(1.5)
    finally:
        await admin.aclose()


@pytest.mark.parametrize("engine", [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.skipif(
        postgres_binaries() is None, reason="needs initdb and pg_ctl on PATH")),
])
async def test_money_is_exact_after_redis_faults_under_load(tmp_path: Path, engine: str) -> None:
    redis = AofRedis(tmp_path / "redis")
    await redis.start()
    postgres: PrivatePostgres | None = None
    database: Path | str = tmp_path / "spend.db"
    if engine == "postgresql":
        postgres = await trio.to_thread.run_sync(PrivatePostgres)  # initdb: off the loop
        await trio.to_thread.run_sync(postgres.start)
        database = postgres.url
    gateways: list[GatewayProcess] = []
    try:
        async with open_fake_upstream() as upstream:
            for i in range(2):
                config = tmp_path / f"gateway-{i}.yaml"
                write_config(config, state=tmp_path / f"state-{i}", redis_url=redis.url,
                             database=database, upstream_url=upstream.base_url)
                gateways.append(GatewayProcess(config, tmp_path / f"gateway-{i}.log"))
            with trio.fail_after(100):
                for gateway in gateways:
                    await gateway.wait_ready()
                made = await create_principals(gateways[0].url)
                stats = LoadStats()
                faults: list[str] = []
                stop = trio.Event()
                async with trio.open_nursery() as nursery:
                    for c in range(CLIENTS):
                        nursery.start_soon(partial(client_loop, [g.url for g in gateways],
                                                   made, stats, stop, seed=c))
                    await inject_faults(redis, faults, postgres)
                    stop.set()
                bodies = [await g.wait_settled() for g in gateways]
                metrics = [await g.metrics() for g in gateways]
                codes = [await g.stop() for g in gateways]
                report = await money_check(redis.url, database, made)
    finally:
        for gateway in gateways:
            gateway.kill()
        await trio.to_thread.run_sync(redis.stop)  # waits up to 5 s for the exit
        if postgres is not None:
            await trio.to_thread.run_sync(postgres.stop)
    answered = sum(stats.statuses.values())
    print(f"\nrequests sent {stats.sent}, answered {answered} {dict(stats.statuses)}, "
          f"streams {stats.streams}, transport errors {stats.transport_errors}")
    print(f"faults injected ({len(faults)}): {'; '.join(faults)}")
    print(f"spend-log rows {report.rows}, principals checked {report.principals}, "
          f"spend {report.spend_nanousd} nano-USD")
    print(f"discrepancies: {len(report.discrepancies)}")
    for line in report.discrepancies:
        print("  " + line)
    assert codes == [0, 0]
    assert len(faults) == (6 if postgres is not None else 5)
    assert stats.transport_errors == 0 and answered == stats.sent
    assert report.rows == answered  # one spend-log row per request, none lost
    assert report.spend_nanousd > 0
    assert report.discrepancies == []
    assert all(b["redis"] == "connected" for b in bodies)
    for text in metrics:
        assert "triogate_dead_letters 0.0" in text
