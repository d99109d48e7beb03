"""A fleet on one machine: three gateway hosts of two workers each in network namespaces, one
Redis and one PostgreSQL in namespaces of their own, under load, through faults.

Each host is a ``triogate serve --workers 2`` in its own namespace (``gw1``, ``gw2``,
``gw3``); Redis (a Redis Cluster of three primaries with a replica each, or with
``TRIOGATE_FLEET_REDIS=single`` one primary; AOF, ``appendfsync always``) and a private
PostgreSQL each run in another; everything talks over veth pairs and a bridge
(``tests/fleet/netns.py``). ``gw2`` runs with both failure policies ``fail-closed``, the
others ``fail-open``. Load clients spread chats and streams over the three hosts, random
keys, teams and end users; more clients hammer one key whose RPM limit is 600.

1. One minute without faults, starting on a window bucket's boundary: the key with the
   600 RPM limit, hammered through all six workers, is admitted 600 times ± 1 %.
2. Then the faults, each followed by normal load: a cluster primary killed (-9) until its
   replica is promoted (single: Redis killed and restarted from its AOF 1.5 s later);
   ``gw1`` and ``gw2`` cut off from Redis for 10 s (iptables DROP both ways in their
   namespaces): ``gw1`` keeps serving with ``x-triogate-degraded``, ``gw2`` answers 503,
   ``gw3`` is untouched; PostgreSQL crashed and started again 1.5 s later.
3. Afterwards, once every host has replayed its journal and stopped cleanly: for every key,
   team and end user, Redis's spend equals the sum of its spend rows in PostgreSQL to the
   nano-dollar, with nothing reserved, held or leased; one spend row per answered request.

About two and a half minutes. Needs root, iproute2 and iptables (``.ci/run`` installs
iptables), redis-server and PostgreSQL's initdb/pg_ctl; it skips without them, unless
``TRIOGATE_REQUIRE_FLEET`` is set (CI), where it fails instead.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections import defaultdict
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio
import yaml

from tests.chaos.harness import (
    MASTER_KEY,
    Principals,
    create_principals,
    money_check,
    postgres_binaries,
    redis_binary,
    write_config,
)
from tests.fleet import netns
from tests.fleet.hosts import GatewayHost, NsCluster, NsPostgres, NsRedis
from triogate.store.records import hash_key
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def _why_not() -> str | None:
    if (why := netns.missing()) is not None:
        return why
    if redis_binary() is None:
        return "needs redis-server on PATH"
    if postgres_binaries() is None:
        return "needs initdb and pg_ctl on PATH (and a postgres user when root)"
    return None


WHY_NOT = _why_not()
if WHY_NOT is not None and os.environ.get("TRIOGATE_REQUIRE_FLEET"):
    raise RuntimeError(f"TRIOGATE_REQUIRE_FLEET is set but the fleet test cannot run: {WHY_NOT}")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.chaos,
    pytest.mark.fleet,
    pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or ""),
]

HOSTS = ("gw1", "gw2", "gw3")
FAIL_CLOSED = "gw2"
CUT = ("gw1", "gw2")
RPM_LIMIT = 600
MINUTE_S = 60.0
GENERAL_CLIENTS = 8
RPM_CLIENTS = 6
#: ``cluster`` (the default): three primaries with a replica each, AOF; a primary is killed
#: and its replica promoted. ``single``: one primary with AOF, killed and restarted.
REDIS_MODE = os.environ.get("TRIOGATE_FLEET_REDIS", "cluster")


@pytest.fixture
def network() -> Iterator[netns.Network]:
    with netns.open_network([*HOSTS, "redis", "pg"]) as made:
        yield made


@attrs.define
class Answer:
    """One request as a client saw it."""

    host: str
    sent: float
    done: float
    status: int
    degraded: bool


@attrs.define
class Load:
    answers: list[Answer] = attrs.Factory(list)
    rpm: list[Answer] = attrs.Factory(list)
    transport_errors: list[str] = attrs.Factory(list)


async def general_client(hosts: dict[str, GatewayHost], made: Principals, load: Load,
                         stop: trio.Event, *, seed: int) -> None:
    """Chats and streams back to back: random host, key and end user."""
    rng = random.Random(seed)
    names = sorted(hosts)
    async with httpx.AsyncClient(timeout=30) as http:
        while not stop.is_set():
            host = rng.choice(names)
            body: dict[str, Any] = {
                "model": "gpt-chaos", "user": rng.choice(made.end_users),
                "max_tokens": rng.randint(4, 24),
                "messages": [{"role": "user", "content": f"fleet {rng.random()}"}]}
            headers = {"authorization": f"Bearer {rng.choice(made.keys)}"}
            url = f"{hosts[host].url}/v1/chat/completions"
            sent = time.time()
            try:
                if rng.random() < 0.25:
                    body["stream"] = True
                    async with http.stream("POST", url, json=body, headers=headers) as r:
                        async for _ in r.aiter_bytes():
                            pass
                else:
                    r = await http.post(url, json=body, headers=headers)
            except httpx.TransportError as exc:
                load.transport_errors.append(f"{host}: {exc!r}")
                continue
            load.answers.append(Answer(host, sent, time.time(), r.status_code,
                                       "x-triogate-degraded" in r.headers))


async def rpm_client(hosts: dict[str, GatewayHost], key: str, load: Load, stop: trio.Event,
                     *, start_at: float, index: int) -> None:
    """The limited key, back to back from ``start_at``, round robin over the hosts."""
    names = sorted(hosts)
    await trio.sleep(max(0.0, start_at - time.time()))
    body = {"model": "gpt-chaos", "max_tokens": 4,
            "messages": [{"role": "user", "content": "rpm"}]}
    turn = index
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {key}"}) as http:
        while not stop.is_set():
            host = names[turn % len(names)]
            turn += 1
            sent = time.time()
            try:
                r = await http.post(f"{hosts[host].url}/v1/chat/completions", json=body)
            except httpx.TransportError as exc:
                load.transport_errors.append(f"{host}: {exc!r}")
                continue
            load.rpm.append(Answer(host, sent, time.time(), r.status_code,
                                   "x-triogate-degraded" in r.headers))


def host_config(path: Path, *, state: Path, redis_url: str, database: str, upstream_url: str,
                fail_closed: bool) -> None:
    write_config(path, state=state, redis_url=redis_url, database=database,
                 upstream_url=upstream_url)
    if fail_closed:
        config = yaml.safe_load(path.read_text())
        config["triogate"]["policies"] = {"budgets": "fail-closed", "rate_limits": "fail-closed"}
        path.write_text(yaml.safe_dump(config))


async def readiness(host: GatewayHost, samples: int) -> list[dict[str, Any]]:
    """``samples`` readiness bodies of ``host`` (any of its workers answers each)."""
    bodies = []
    async with httpx.AsyncClient(timeout=10) as http:
        for _ in range(samples):
            bodies.append((await http.get(f"{host.url}/health/readiness")).json())
    return bodies


async def inject_faults(network: netns.Network, redis: NsRedis | NsCluster,
                        postgres: NsPostgres, marks: dict[str, tuple[float, float]],
                        cut_off: GatewayHost, seen_cut: list[dict[str, Any]]) -> None:
    """Each fault, then a stretch of normal load; ``marks`` gets each fault's span,
    ``seen_cut`` the readiness of ``cut_off`` (a fail-open host) late in the cut."""
    began = time.time()
    if isinstance(redis, NsRedis):
        await trio.to_thread.run_sync(redis.kill)
        await trio.sleep(1.5)
        await trio.to_thread.run_sync(redis.start)
        marks["redis killed"] = (began, time.time())
    else:
        primary = await trio.to_thread.run_sync(redis.primary)
        await trio.to_thread.run_sync(primary.kill)
        await trio.to_thread.run_sync(redis.wait_ok)  # its replica took over
        marks["cluster primary killed"] = (began, time.time())
    await trio.sleep(2.0)

    began = time.time()
    for host in CUT:
        await trio.to_thread.run_sync(network.cut, host, "redis")
    await trio.sleep(7.0)
    seen_cut.extend(await readiness(cut_off, 4))  # each waits out the Redis timeout
    await trio.sleep(max(0.0, began + 10.0 - time.time()))
    marks["cut"] = (began, time.time())  # what follows is the heal
    for host in CUT:
        await trio.to_thread.run_sync(network.heal, host, "redis")
    await trio.sleep(3.0)

    began = time.time()
    await trio.to_thread.run_sync(postgres.crash)
    await trio.sleep(1.5)
    await trio.to_thread.run_sync(postgres.start)
    marks["postgres restarted"] = (began, time.time())
    await trio.sleep(2.0)


def row_statuses(database: str) -> dict[str, int]:
    """Spend rows per status."""
    import psycopg

    with psycopg.connect(database) as pg:
        rows = pg.execute("SELECT status, count(*) FROM spend_logs GROUP BY status").fetchall()
    return {status: int(n) for status, n in rows}


def count(answers: list[Answer], **where: Any) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for a in answers:
        if all(getattr(a, k) == v for k, v in where.items()):
            out[a.status] += 1
    return dict(out)


def within(answers: list[Answer], start: float, end: float) -> list[Answer]:
    """Answers to requests sent at or after ``start`` and answered before ``end``."""
    return [a for a in answers if a.sent >= start and a.done < end]


async def test_fleet_money_and_limits_through_faults(tmp_path: Path,
                                                     network: netns.Network) -> None:
    redis: NsRedis | NsCluster = (
        NsCluster(network, tmp_path / "cluster", primaries=3, replicas=1)
        if REDIS_MODE == "cluster" else NsRedis(network, tmp_path / "redis"))
    await trio.to_thread.run_sync(redis.start)
    postgres = await trio.to_thread.run_sync(NsPostgres, network)
    hosts: dict[str, GatewayHost] = {}
    marks: dict[str, tuple[float, float]] = {}
    seen_cut: list[dict[str, Any]] = []
    load = Load()
    try:
        await trio.to_thread.run_sync(postgres.start)
        async with open_fake_upstream(host=network.gateway_ip) as upstream:
            for name in HOSTS:
                config = tmp_path / f"{name}.yaml"
                host_config(config, state=tmp_path / f"state-{name}", redis_url=redis.url,
                            database=postgres.url, upstream_url=upstream.base_url,
                            fail_closed=name == FAIL_CLOSED)
                hosts[name] = await trio.to_thread.run_sync(
                    GatewayHost, network, name, config, tmp_path / f"{name}.log")
            for host in hosts.values():
                await trio.to_thread.run_sync(host.wait_ready)
            made = await create_principals(hosts["gw1"].url, keys_per_team=3, end_users=4)
            async with httpx.AsyncClient(
                    timeout=20, headers={"authorization": f"Bearer {MASTER_KEY}"}) as http:
                limited = await http.post(f"{hosts['gw1'].url}/key/generate", json={
                    "team_id": made.teams[0], "max_budget": 1000, "rpm_limit": RPM_LIMIT})
                assert limited.status_code == 200, limited.text
            limited_key = limited.json()["key"]

            stop = trio.Event()
            minute_start = math.ceil(time.time()) + 2.0  # a window bucket's boundary
            with trio.fail_after(MINUTE_S + 60):  # the minute, the faults (~25 s), margin
                async with trio.open_nursery() as nursery:
                    for c in range(GENERAL_CLIENTS):
                        nursery.start_soon(partial(general_client, hosts, made, load, stop,
                                                   seed=c))
                    for c in range(RPM_CLIENTS):
                        nursery.start_soon(partial(rpm_client, hosts, limited_key, load, stop,
                                                   start_at=minute_start, index=c))
                    await trio.sleep(minute_start + MINUTE_S - time.time())
                    await inject_faults(network, redis, postgres, marks, hosts["gw1"],
                                        seen_cut)
                    stop.set()
            for host in hosts.values():
                await trio.to_thread.run_sync(host.wait_settled)
            codes = {name: await trio.to_thread.run_sync(host.stop)
                     for name, host in hosts.items()}
            made.key_hashes.append(hash_key(limited_key))
            report = await money_check(redis.url, postgres.url, made)
            statuses = await trio.to_thread.run_sync(row_statuses, postgres.url)
    finally:
        for host in hosts.values():
            await trio.to_thread.run_sync(host.kill)
        await trio.to_thread.run_sync(redis.stop)
        await trio.to_thread.run_sync(postgres.stop)

    # What happened, for the log.
    minute_end = minute_start + MINUTE_S
    # Sent and answered within the minute: a request in flight at its end may be admitted
    # in the next window's first second, when the minute's first admissions slide out.
    first_minute = [a for a in load.rpm if minute_start <= a.sent and a.done < minute_end]
    admitted = sum(1 for a in first_minute if a.status == 200)
    print(f"\nlimited key, {minute_start:.0f}..{minute_end:.0f} (no fault): "
          f"{count(first_minute)} -> {admitted} admitted of {RPM_LIMIT}")
    for name in HOSTS:
        print(f"{name}: {count(load.answers, host=name)}")
    for fault, (began, ended) in marks.items():
        print(f"{fault} ({ended - began:.1f} s): "
              f"{ {n: count(within(load.answers, began, ended), host=n) for n in HOSTS} }")
    ok = sum(1 for a in load.answers + load.rpm if a.status == 200)
    print(f"answered 200: {ok}, spend rows {report.rows} {statuses}, "
          f"principals {report.principals}, spend {report.spend_nanousd} nano-USD, "
          f"transport errors {len(load.transport_errors)}")
    print(f"gw1 late in the cut: {[b['settler'] for b in seen_cut]}")
    for line in report.discrepancies:
        print("  " + line)

    assert codes == dict.fromkeys(HOSTS, 0)
    assert not load.transport_errors, load.transport_errors[:5]
    # The minute without faults: the fleet-wide limit holds, and every host is healthy.
    assert abs(admitted - RPM_LIMIT) <= RPM_LIMIT // 100, admitted
    assert count(first_minute).get(429, 0) > 0
    calm = [a for a in load.answers if minute_start <= a.sent and a.done < minute_end]
    assert calm and all(a.status == 200 and not a.degraded for a in calm)
    # The cut: fail-open serves degraded, fail-closed refuses, the untouched host is normal.
    began, ended = marks["cut"]
    settled_in = began + 1.0  # requests in flight when the rules went in are mixed
    cut = within(load.answers, settled_in, ended)
    open_cut = [a for a in cut if a.host == "gw1"]
    closed_cut = [a for a in cut if a.host == FAIL_CLOSED]
    normal = [a for a in cut if a.host == "gw3"]
    assert open_cut and all(a.status == 200 and a.degraded for a in open_cut)
    assert closed_cut and all(a.status == 503 for a in closed_cut)
    assert normal and all(a.status == 200 and not a.degraded for a in normal)
    # The cut-off fail-open host held its post-call writes back (queued or journaled)
    # meanwhile; wait_settled saw them all written once the link healed.
    assert seen_cut and all(b["redis"].startswith("unavailable") for b in seen_cut)
    assert any(b["settler"]["queued"] or b["settler"]["journal_pending"] for b in seen_cut)
    # Money: one spend row per answered request (refusals too, at no cost); Redis ==
    # PostgreSQL to the nano-dollar, nothing reserved, held or leased.
    assert statuses.get("success", 0) == ok
    assert report.rows == len(load.answers) + len(load.rpm)
    assert report.spend_nanousd > 0
    assert report.discrepancies == []
