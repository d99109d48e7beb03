"""SentinelBackend against a real primary, replica and sentinel (valkey-server binaries).

The backend finds the primary through the sentinel, keeps sending to it, and follows a
failover three ways: a pipeline that fails when the primary dies, a ``READONLY`` reply
from a primary that was demoted, and the sentinel's ``+switch-master`` announcement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from tests.integration.cluster_server import free_ports
from tests.integration.sentinel_server import SERVICE, LocalSentinel
from triogate.batch import BackendUnavailable, SentinelAddress, SentinelBackend
from triogate.config import parse_config
from triogate.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[LocalSentinel]:
    sentinel = LocalSentinel(tmp_path)
    try:
        yield sentinel
    finally:
        sentinel.stop()


async def until_served(backend: SentinelBackend, commands: list[tuple[object, ...]],
                       timeout_s: float = 30.0) -> list[object]:
    """Send ``commands`` until a pipeline succeeds (through a failover), bounded."""
    with trio.fail_after(timeout_s):
        while True:
            try:
                return await backend.execute(commands)  # type: ignore[arg-type]
            except BackendUnavailable:
                await trio.sleep(0.05)


async def test_finds_the_primary_skipping_a_dead_sentinel(pair: LocalSentinel) -> None:
    dead = pair.replica + 10_000 if pair.replica < 55_000 else pair.replica - 10_000
    url = f"redis+sentinel://127.0.0.1:{dead},127.0.0.1:{pair.sentinel}/{SERVICE}"
    backend = SentinelBackend(url, command_timeout_s=1.0)
    try:
        assert await backend.execute([("SET", "k", "v"), ("GET", "k")]) == [b"OK", b"v"]
        assert backend.primary == ("127.0.0.1", pair.primary)
        assert backend.switches == 0
    finally:
        await backend.aclose()


async def test_follows_the_replica_promoted_after_the_primary_dies(pair: LocalSentinel) -> None:
    backend = SentinelBackend(pair.url, command_timeout_s=0.5)
    try:
        await backend.execute([("SET", "counter", 1)])
        # Acknowledged by the replica before the primary dies: it must survive.
        assert (await backend.execute([("WAIT", 1, 2000)])) == [1]
        await trio.to_thread.run_sync(pair.kill, pair.primary)
        with pytest.raises(BackendUnavailable):
            await backend.execute([("INCR", "counter")])
        replies = await until_served(backend, [("INCR", "counter")])
        assert replies == [2]
        assert backend.primary == ("127.0.0.1", pair.replica)
        assert backend.switches == 1
    finally:
        await backend.aclose()


async def test_leaves_a_demoted_primary_on_its_readonly_reply(pair: LocalSentinel) -> None:
    backend = SentinelBackend(pair.url, command_timeout_s=1.0)
    try:
        await backend.execute([("SET", "k", "before")])
        assert (await backend.execute([("WAIT", 1, 2000)])) == [1]
        # A failover the sentinel runs while the old primary lives on, demoted.
        await trio.to_thread.run_sync(pair.failover)
        await trio.to_thread.run_sync(pair.wait_failover)
        with trio.fail_after(20):
            while await trio.to_thread.run_sync(pair.role, pair.primary) != b"slave":
                await trio.sleep(0.05)
        # The old primary now answers writes with READONLY: the backend says unavailable
        # (nothing was written) and finds the new primary for the next pipeline.
        with pytest.raises(BackendUnavailable, match="not the primary"):
            await backend.execute([("SET", "k", "after")])
        assert await until_served(backend, [("SET", "k", "after"), ("GET", "k")]) == [
            b"OK", b"after"]
        assert backend.primary == ("127.0.0.1", pair.replica)
    finally:
        await backend.aclose()


async def test_watch_switches_on_the_sentinels_announcement(pair: LocalSentinel) -> None:
    backend = SentinelBackend(pair.url, command_timeout_s=1.0)
    try:
        await backend.execute([("PING",)])
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.watch)
            await trio.sleep(0.3)  # subscribed
            await trio.to_thread.run_sync(pair.failover)
            # No pipeline is sent meanwhile: the announcement alone moves the backend.
            with trio.fail_after(20):
                while backend.primary != ("127.0.0.1", pair.replica):
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert backend.switches == 1
    finally:
        await backend.aclose()


async def test_no_sentinel_answers_is_backend_unavailable(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    backend = SentinelBackend(f"redis+sentinel://127.0.0.1:{port}/{SERVICE}",
                              command_timeout_s=0.3)
    try:
        with pytest.raises(BackendUnavailable, match="sentinel"):
            await backend.execute([("PING",)])
    finally:
        await backend.aclose()


# ---------------------------------------------------------------------- URLs and config


def test_sentinel_url_parses() -> None:
    address = SentinelAddress.from_url(
        "rediss+sentinel://app:s3cret@10.0.0.1:26379,[::1]:26380/mymaster/2"
        "?sentinel_password=sp")
    assert address.sentinels == (("10.0.0.1", 26379), ("::1", 26380))
    assert address.service == "mymaster"
    assert address.tls and address.db == 2
    assert (address.username, address.password) == ("app", "s3cret")
    assert address.sentinel_password == "sp"
    assert address.primary_url("10.0.0.9", 6379) == "rediss://app:s3cret@10.0.0.9:6379/2"
    assert address.sentinel_url("10.0.0.1", 26379) == "rediss://:sp@10.0.0.1:26379/0"


@pytest.mark.parametrize("url", ["redis+sentinel://h:1", "redis+sentinel:///svc",
                                 "redis+sentinel://host/svc", "redis://h:1/svc"])
def test_bad_sentinel_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        SentinelAddress.from_url(url)


def test_litellm_sentinel_settings_become_the_redis_url() -> None:
    config = parse_config({"litellm_settings": {"cache": True, "cache_params": {
        "type": "redis", "service_name": "mymaster", "password": "pw",
        "sentinel_nodes": [["10.0.0.1", 26379], ["10.0.0.2", "26379"]],
        "sentinel_password": "sp"}}})
    url = config.settings.redis.url
    assert url == "redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster?sentinel_password=sp"
    address = SentinelAddress.from_url(url)
    assert address.password == "pw" and address.sentinel_password == "sp"


@pytest.mark.parametrize("params", [
    {"service_name": "mymaster"},
    {"sentinel_nodes": [["h", 1]]},
    {"service_name": "m", "redis_sentinel_nodes": ["no-port"]},
])
def test_incomplete_sentinel_settings_are_refused(params: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="entinel"):
        parse_config({"litellm_settings": {"cache_params": params}})


async def test_writes_fewer_replicas_acknowledged_count_as_failed(pair: LocalSentinel) -> None:
    """``wait_replicas``: a pipeline whose writes did not reach that many replicas fails
    as a whole (its owners journal and replay it); with enough replicas it succeeds."""
    enough = SentinelBackend(pair.url, command_timeout_s=0.4, wait_replicas=1)
    too_many = SentinelBackend(pair.url, command_timeout_s=0.4, wait_replicas=2)
    try:
        assert await enough.execute([("INCR", "n")]) == [1]
        with pytest.raises(BackendUnavailable, match="1 of 2 replicas acknowledged"):
            await too_many.execute([("INCR", "n")])
    finally:
        await enough.aclose()
        await too_many.aclose()
