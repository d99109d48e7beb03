"""The cluster backend's logic on MockClock: hash slots, key extraction, grouping by node,
concurrency, redirections and node failures, against a fake three-node cluster built from
``RecordingBackend`` (one per node) and ``FaultyBackend``."""

from __future__ import annotations

import binascii
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from triogate.batch import (
    BackendUnavailable,
    Batch,
    ClusterBackend,
    CommandError,
    MemoryTracer,
    Script,
    open_batch_scope,
)
from triogate.batch._cluster_map import cluster_seeds
from triogate.batch._slots import (
    SLOTS,
    Spread,
    arg_bytes,
    command_keys,
    command_name,
    command_slot,
    crc16,
    key_slot,
)
from triogate.batch.testing import FaultyBackend, RecordingBackend

if TYPE_CHECKING:
    from collections.abc import Sequence
    from contextlib import AbstractAsyncContextManager

    from trio.testing import MockClock

    from triogate.batch import Subscription
    from triogate.batch._backend import Wire


# --------------------------------------------------------------------------- hash slots


def test_crc16_check_value_and_the_specs_example_slot() -> None:
    assert crc16(b"123456789") == 0x31C3  # CRC16-XMODEM's published check value
    assert key_slot("123456789") == 12739  # the Redis Cluster spec's example


@given(st.binary(max_size=64))
def test_crc16_agrees_with_the_standard_librarys_crc_hqx(data: bytes) -> None:
    assert crc16(data) == binascii.crc_hqx(data, 0)


@pytest.mark.parametrize(
    ("key", "hashed"),
    [
        ("{user1000}.following", b"user1000"),
        ("{user1000}.followers", b"user1000"),
        ("foo{}{bar}", b"foo{}{bar}"),  # the first {} is empty: the whole key
        ("foo{{bar}}zap", b"{bar"),  # from the first { to the first } after it
        ("foo{bar}{zap}", b"bar"),  # only the first tag counts
        ("foo{bar", b"foo{bar"),  # no closing brace
        ("}foo{bar}", b"bar"),
        ("tg:{key:abc}:bud:0", b"key:abc"),
        (b"\xff{\x00}", b"\x00"),
        (42, b"42"),
    ],
)
def test_hash_tags(key: str | bytes | int, hashed: bytes) -> None:
    assert key_slot(key) == crc16(hashed) % SLOTS


def test_keys_sharing_a_tag_share_a_slot() -> None:
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("{user1000}.following") != key_slot("user1000.following")


@given(st.text(min_size=1).filter(lambda t: "}" not in t), st.text(), st.text())
def test_a_tag_decides_the_slot_whatever_surrounds_it(tag: str, before: str, after: str) -> None:
    before = before.replace("{", "")
    assert key_slot(f"{before}{{{tag}}}{after}") == key_slot(tag)


# --------------------------------------------------------------------------- key extraction


@pytest.mark.parametrize(
    ("wire", "keys"),
    [
        (("GET", "a"), ("a",)),
        (("set", "a", "1", "PX", 10), ("a",)),
        ((b"HINCRBY", "h", "f", 1), ("h",)),
        (("ZREMRANGEBYSCORE", "z", 0, 10), ("z",)),
        (("PTTL", "a"), ("a",)),
        (("EVALSHA", "abc", 2, "k1", "k2", "arg"), ("k1", "k2")),
        (("EVAL", "return 1", "1", "k1", "arg"), ("k1",)),
        (("FCALL", "fn", 1, "k", "a"), ("k",)),
        (("EVALSHA", "abc", 0, "arg"), Spread.ANY),
        (("EVALSHA", "abc", "x", "k"), Spread.ANY),  # a malformed count: let a node say so
        (("EVALSHA", "abc", 5, "k"), Spread.ANY),
        (("MGET", "a", "b", "c"), ("a", "b", "c")),
        (("DEL", "a", "b"), ("a", "b")),
        (("EXISTS", "a"), ("a",)),
        (("UNLINK", "a"), ("a",)),
        (("TOUCH", "a", "b"), ("a", "b")),
        (("MSET", "a", 1, "b", 2), ("a", "b")),
        (("RENAME", "a", "b"), ("a", "b")),
        (("BLPOP", "a", "b", 0), ("a", "b")),
        (("ZUNIONSTORE", "d", 2, "a", "b", "WEIGHTS", 1, 2), ("d", "a", "b")),
        (("SINTERCARD", 2, "a", "b", "LIMIT", 1), ("a", "b")),
        (("OBJECT", "ENCODING", "a"), ("a",)),
        (("XINFO", "STREAM", "s"), ("s",)),
        (("PING",), Spread.ANY),
        (("PUBLISH", "chan", "msg"), Spread.ANY),
        (("INFO", "server"), Spread.ANY),
        (("TIME",), Spread.ANY),
        (("ECHO", "hi"), Spread.ANY),
        (("CLUSTER", "SLOTS"), Spread.ANY),
        (("SCRIPT", "KILL"), Spread.ANY),
        (("SCRIPT", "LOAD", "return 1"), Spread.ALL),
        (("script", "flush"), Spread.ALL),
        (("SCRIPT", "EXISTS", "abc"), Spread.ALL),
        (("FLUSHALL",), Spread.ALL),
        (("FLUSHALL", "ASYNC"), Spread.ALL),
        (("FLUSHDB",), Spread.ALL),
        (("MULTI",), Spread.UNSUPPORTED),
        (("WATCH", "a"), Spread.UNSUPPORTED),
        (("SOMEMODULE.ADD", "k", "v"), ("k",)),  # unknown: the first argument is the key
        (("NOARGS",), Spread.ANY),
    ],
)
def test_key_extraction(wire: Wire, keys: tuple[object, ...] | Spread) -> None:
    assert command_keys(wire) == keys


def test_command_slot_refuses_keys_in_two_slots_and_accepts_one_tag() -> None:
    assert command_slot(("MGET", "a", "b")) is Spread.CROSSSLOT
    assert command_slot(("MGET", "{t}a", "{t}b")) == key_slot("t")
    assert command_slot(("EVALSHA", "s", 2, "{t}a", "{u}b")) is Spread.CROSSSLOT
    assert command_slot(("EVALSHA", "s", 1, "{t}a", "{u}b")) == key_slot("t")  # ARGV: free


def test_seeds_parse() -> None:
    seeds = cluster_seeds("redis+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001")
    assert [(s.host, s.port, s.username, s.password, s.tls) for s in seeds] == [
        ("10.0.0.1", 7000, "u", "p@ss", False), ("10.0.0.2", 7001, "u", "p@ss", False)]
    assert cluster_seeds("rediss+cluster://:pw@h:1")[0].tls
    assert [s.port for s in cluster_seeds(["redis://a:1", "redis://b:2"])] == [1, 2]
    assert cluster_seeds("redis://a:1")[0].host == "a"
    for bad in ("unix:///tmp/s.sock", "redis://a:1/3", "redis+cluster://"):
        with pytest.raises(ValueError, match=r"socket|database|seed"):
            cluster_seeds(bad)
    assert ClusterBackend.is_cluster_url("redis+cluster://a:1,b:2")
    assert not ClusterBackend.is_cluster_url("redis://a:1")
    shown = ClusterBackend("redis+cluster://u:secret@a:1,b:2").url
    assert "secret" not in shown and "a:1,b:2" in shown


# --------------------------------------------------------------------------- a fake cluster

N1, N2, N3 = "n1:1", "n2:2", "n3:3"
RANGES = {N1: (0, 5460), N2: (5461, 10922), N3: (10923, 16383)}


class FakeCluster:
    """Three nodes sharing one truth about slot ownership; each node keeps its own data.

    A node answers MOVED for slots it does not own, ASK for missing keys of a slot it is
    migrating, and honours ASKING for a slot it is importing, as Redis does.
    """

    def __init__(self, *, delay_s: float = 0.0, scripts_loaded: bool = True) -> None:
        self.owner = [""] * SLOTS
        for address, (first, last) in RANGES.items():
            self.owner[first : last + 1] = [address] * (last - first + 1)
        self.migrating: dict[int, str] = {}
        self.nodes = {a: FakeNode(self, a, delay_s, scripts_loaded) for a in RANGES}

    def factory(self, url: str, name: str) -> FakeNode:
        return self.nodes[urlsplit(url).netloc]

    def slots_reply(self) -> list[object]:
        ranges: list[object] = []
        start = 0
        for slot in range(1, SLOTS + 1):
            if slot == SLOTS or self.owner[slot] != self.owner[start]:
                host, port = self.owner[start].split(":")
                ranges.append([start, slot - 1, [host.encode(), int(port), b"id"]])
                start = slot
        return ranges

    def key_on(self, address: str, prefix: str = "k") -> str:
        """A key whose slot ``address`` owns."""
        return next(f"{prefix}{i}" for i in range(10_000)
                    if self.owner[key_slot(f"{prefix}{i}")] == address)

    def move(self, slot: int, target: str) -> None:
        """Finish migrating ``slot`` (and its keys) to ``target``."""
        source = self.nodes[self.owner[slot]]
        for key in [k for k in source.data if key_slot(k) == slot]:
            self.nodes[target].data[key] = source.data.pop(key)
        self.owner[slot] = target
        self.migrating.pop(slot, None)


class FakeNode:
    """One node: a RecordingBackend (records pipelines) behind a FaultyBackend (down)."""

    def __init__(self, cluster: FakeCluster, address: str, delay_s: float,
                 scripts_loaded: bool) -> None:
        self.cluster = cluster
        self.address = address
        self.data: dict[bytes, bytes] = {}
        self.asking = False
        self.closed = 0
        #: What ``WAIT`` answers: how many replicas acknowledged.
        self.acks = 1
        self.recording = RecordingBackend(respond=self._respond, name=address, delay_s=delay_s,
                                          scripts_loaded=scripts_loaded)
        self.faulty = FaultyBackend(self.recording)

    @property
    def name(self) -> str:
        return self.address

    @property
    def pipelines(self) -> list[list[Wire]]:
        return self.recording.pipelines

    async def execute(self, commands: Sequence[Wire]) -> list[object]:
        return await self.faulty.execute(commands)

    def open_subscription(self, *channels: str) -> AbstractAsyncContextManager[Subscription]:
        raise NotImplementedError("the fake cluster has no pub/sub")

    async def aclose(self) -> None:
        self.closed += 1
        await trio.lowlevel.checkpoint()

    def _respond(self, wire: Wire) -> object:
        name = command_name(wire)
        asking, self.asking = self.asking, False
        if name == "ASKING":
            self.asking = True
            return b"OK"
        if name == "CLUSTER":
            return self.cluster.slots_reply()
        if name == "WAIT":
            return self.acks
        if name in ("PING", "ECHO", "SCRIPT", "FLUSHALL"):
            return arg_bytes(wire[-1]) if name == "ECHO" else f"{name}@{self.address}".encode()
        slot = command_slot(wire)
        assert isinstance(slot, int), wire
        owner = self.cluster.owner[slot]
        target = self.cluster.migrating.get(slot)
        if owner != self.address and not (asking and target == self.address):
            return CommandError(f"MOVED {slot} {owner}")
        keys = command_keys(wire)
        assert isinstance(keys, tuple)
        key = arg_bytes(keys[0])
        if target is not None and owner == self.address and key not in self.data:
            return CommandError(f"ASK {slot} {target}")
        if name == "SET":
            self.data[key] = arg_bytes(wire[2])
            return b"OK"
        if name == "GET":
            return self.data.get(key)
        return f"{name}@{self.address}".encode()


def cluster_backend(fake: FakeCluster, **kwargs: float) -> ClusterBackend:
    return ClusterBackend("redis+cluster://n1:1,n2:2", name="cluster",
                          node_backend=fake.factory, **kwargs)  # type: ignore[arg-type]


async def warmed(fake: FakeCluster, **kwargs: float) -> ClusterBackend:
    """A backend with its slot map; every node's recorded pipelines cleared."""
    backend = cluster_backend(fake, **kwargs)
    await backend.execute([("PING",)])
    for node in fake.nodes.values():
        node.pipelines.clear()
    return backend


# --------------------------------------------------------------------------- grouping


async def test_one_pipeline_per_node_all_nodes_at_once(autojump_clock: MockClock) -> None:
    fake = FakeCluster(delay_s=1.0)
    backend = await warmed(fake)
    keys = [fake.key_on(a, p) for p in ("a", "b") for a in (N3, N1, N2)]
    for node in fake.nodes.values():
        node.data.update({k.encode(): k.upper().encode() for k in keys})
    started = trio.current_time()
    replies = await backend.execute([("GET", k) for k in keys])
    # Three nodes, each 1 s away: one second, not three.
    assert trio.current_time() - started == 1.0
    assert replies == [k.upper().encode() for k in keys]
    for address, node in fake.nodes.items():
        assert node.pipelines == [[("GET", k) for k in keys if fake.owner[key_slot(k)] == address]]
    stats = backend.statistics()
    assert (stats.pipelines, stats.node_pipelines, stats.nodes) == (2, 4, 3)


async def test_the_first_execute_fetches_the_slot_map_from_a_seed(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster()
    backend = cluster_backend(fake)
    assert backend.node_of("a") is None
    await backend.execute([("GET", fake.key_on(N3))])
    assert fake.nodes[N1].pipelines == [[("CLUSTER", "SLOTS")]]
    assert backend.nodes == (N1, N2, N3)
    assert backend.node_of(fake.key_on(N2)) == N2
    assert backend.statistics().slot_map_refreshes == 1


async def test_keyless_commands_ride_a_node_already_in_the_round(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster()
    backend = await warmed(fake)
    key = fake.key_on(N2)
    replies = await backend.execute([("PING",), ("SET", key, "v"), ("ECHO", "hi")])
    assert replies == [f"PING@{N2}".encode(), b"OK", b"hi"]
    assert [len(n.pipelines) for n in fake.nodes.values()] == [0, 1, 0]


async def test_per_node_commands_go_to_every_primary(autojump_clock: MockClock) -> None:
    fake = FakeCluster()
    backend = await warmed(fake)
    replies = await backend.execute([("SCRIPT", "LOAD", "return 1"), ("GET", fake.key_on(N3))])
    assert replies == [f"SCRIPT@{N1}".encode(), None]  # the first primary's reply
    assert [n.pipelines for n in fake.nodes.values()] == [
        [[("SCRIPT", "LOAD", "return 1")]],
        [[("SCRIPT", "LOAD", "return 1")]],
        [[("SCRIPT", "LOAD", "return 1"), ("GET", fake.key_on(N3))]],
    ]


async def test_crossslot_fails_that_command_alone_without_sending_it(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster()
    backend = await warmed(fake)
    a, b = fake.key_on(N1), fake.key_on(N2)
    replies = await backend.execute([("MGET", a, b), ("GET", a), ("MULTI",)])
    assert isinstance(replies[0], CommandError) and replies[0].reply.startswith("CROSSSLOT")
    assert replies[1] is None
    assert isinstance(replies[2], CommandError) and "not supported" in replies[2].reply
    assert [n.pipelines for n in fake.nodes.values()] == [[[("GET", a)]], [], []]


# --------------------------------------------------------------------------- redirections


async def test_moved_is_followed_in_a_second_round_for_that_command_only(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster()
    backend = await warmed(fake)
    moving, staying = fake.key_on(N1, "m"), fake.key_on(N1, "s")
    await backend.execute([("SET", moving, "1"), ("SET", staying, "2")])
    fake.move(key_slot(moving), N3)
    for node in fake.nodes.values():
        node.pipelines.clear()
    await trio.sleep(1.0)  # past min_refresh_interval_s: the map is refreshed alongside
    assert await backend.execute([("GET", moving), ("GET", staying)]) == [b"1", b"2"]
    assert fake.nodes[N1].pipelines == [[("GET", moving), ("GET", staying)],
                                        [("CLUSTER", "SLOTS")]]
    assert fake.nodes[N3].pipelines == [[("GET", moving)]]
    stats = backend.statistics()
    assert (stats.redirects, stats.slot_map_refreshes) == (1, 2)
    # The map knows now: straight to the new owner.
    assert backend.node_of(moving) == N3
    assert await backend.execute([("GET", moving)]) == [b"1"]
    assert fake.nodes[N3].pipelines[-1] == [("GET", moving)]
    assert backend.statistics().redirects == 1


async def test_moved_patches_the_slot_even_when_a_refresh_is_not_due(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster()
    backend = await warmed(fake, min_refresh_interval_s=60.0)
    key = fake.key_on(N2)
    fake.move(key_slot(key), N1)
    assert await backend.execute([("SET", key, "x")]) == [b"OK"]
    assert backend.statistics().slot_map_refreshes == 1
    assert backend.node_of(key) == N1


async def test_ask_sends_asking_first_on_the_target_and_keeps_the_map(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster()
    backend = await warmed(fake)
    migrated, left = fake.key_on(N2, "x"), fake.key_on(N2, "y")
    fake.nodes[N2].data[left.encode()] = b"old-home"
    fake.nodes[N3].data[migrated.encode()] = b"new-home"
    fake.migrating[key_slot(migrated)] = N3
    fake.migrating[key_slot(left)] = N3
    assert await backend.execute([("GET", migrated), ("GET", left)]) == [b"new-home",
                                                                           b"old-home"]
    assert fake.nodes[N3].pipelines == [[("ASKING",), ("GET", migrated)]]
    assert backend.node_of(migrated) == N2  # ASK is for this one command only


async def test_redirects_are_bounded(autojump_clock: MockClock) -> None:
    fake = FakeCluster()
    backend = await warmed(fake, max_redirects=2)
    key = fake.key_on(N1)
    slot = key_slot(key)
    # N1 and N2 each claim the other owns the slot: a loop a buggy cluster could cause.
    fake.owner[slot] = N2
    fake.nodes[N2].faulty = FaultyBackend(RecordingBackend(
        respond=lambda wire: CommandError(f"MOVED {slot} {N1}")))
    (reply,) = await backend.execute([("GET", key)])
    assert isinstance(reply, CommandError) and reply.reply.startswith("MOVED")
    assert backend.statistics().redirects == 2


# --------------------------------------------------------------------------- failures


async def test_a_failed_node_fails_only_its_own_commands(autojump_clock: MockClock) -> None:
    fake = FakeCluster()
    backend = await warmed(fake)
    keys = [fake.key_on(a) for a in (N1, N2, N3)]
    fake.nodes[N2].faulty.down = True
    replies = await backend.execute(
        [("SET", keys[0], "1"), ("SET", keys[1], "2"), ("SET", keys[2], "3"),
         ("GET", fake.key_on(N2, "other"))])
    assert replies[0] == replies[2] == b"OK"
    for failed in (replies[1], replies[3]):
        assert isinstance(failed, BackendUnavailable) and N2 in failed.reason
        assert failed.backend == "cluster"
    assert replies[1] is not replies[3]  # an instance per command
    assert backend.statistics().failures == 1
    # A broadcast that one primary missed is unavailable, not half-done.
    (loaded,) = await backend.execute([("SCRIPT", "LOAD", "return 1")])
    assert isinstance(loaded, BackendUnavailable)
    # Keyless commands avoid the node that just failed.
    assert await backend.execute([("PING",)]) != [f"PING@{N2}".encode()]


async def test_a_dead_primary_is_replaced_by_the_map_refreshed_after_its_failure(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster()
    n4 = "n4:4"
    fake.nodes[n4] = FakeNode(fake, n4, 0.0, True)
    backend = await warmed(fake, min_refresh_interval_s=1.0)
    key = fake.key_on(N2)
    fake.nodes[N2].faulty.down = True
    failed, _ = await backend.execute([("SET", key, "1"), ("GET", fake.key_on(N1))])
    assert isinstance(failed, BackendUnavailable) and N2 in failed.reason
    # Until the replica is promoted the map still names the dead node: unavailable.
    await trio.sleep(1.0)
    with pytest.raises(BackendUnavailable, match="no cluster node answered"):
        await backend.execute([("SET", key, "1")])
    # Promoted: the next refresh (due once a second, alongside a round) names it.
    first, last = RANGES[N2]
    fake.owner[first : last + 1] = [n4] * (last - first + 1)
    await trio.sleep(1.0)
    await backend.execute([("GET", fake.key_on(N1))])
    assert await backend.execute([("SET", key, "2")]) == [b"OK"]
    assert fake.nodes[n4].data[key.encode()] == b"2"
    assert backend.nodes == (N1, n4, N3)
    assert fake.nodes[N2].closed == 1  # the dead node's client is closed


async def test_a_new_primary_gets_the_scripts_loaded_on_every_primary(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster()
    n4 = "n4:4"
    fake.nodes[n4] = FakeNode(fake, n4, 0.0, True)
    backend = await warmed(fake, min_refresh_interval_s=1.0)
    await backend.execute([("SCRIPT", "LOAD", "return 1"), ("SCRIPT", "LOAD", "return 2"),
                           ("SCRIPT", "LOAD", "return 1")])
    # N2 dies and its replica n4 is promoted: the next map names n4, which gets the
    # scripts (a promoted replica has none: the script cache is not replicated).
    fake.nodes[N2].faulty.down = True
    with pytest.raises(BackendUnavailable):
        await backend.execute([("GET", fake.key_on(N2))])
    first, last = RANGES[N2]
    fake.owner[first : last + 1] = [n4] * (last - first + 1)
    await trio.sleep(1.0)
    await backend.execute([("GET", fake.key_on(N1))])
    assert fake.nodes[n4].pipelines == [[("SCRIPT", "LOAD", "return 1"),
                                          ("SCRIPT", "LOAD", "return 2")]]
    # The old primaries are not sent them again.
    assert all(("SCRIPT", "LOAD", "return 1") not in pipeline
               for pipeline in fake.nodes[N3].pipelines[1:])


async def test_wait_replicas_ends_each_node_pipeline_with_wait(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster()
    backend = await warmed(fake, wait_replicas=1, command_timeout_s=0.5)
    keys = [fake.key_on(a) for a in (N1, N2)]
    assert await backend.execute([("SET", k, "v") for k in keys]) == [b"OK", b"OK"]
    for address in (N1, N2):
        assert fake.nodes[address].pipelines[-1][-1] == ("WAIT", 1, 250)
    # A node whose replica did not acknowledge fails its own commands, as if it died:
    # the writes may be on the primary alone.
    fake.nodes[N2].acks = 0
    ok, failed = await backend.execute([("SET", k, "w") for k in keys])
    assert ok == b"OK"
    assert isinstance(failed, BackendUnavailable) and "0 of 1 replicas" in failed.reason
    assert backend.statistics().failures == 1


async def test_wait_replicas_lets_a_redirect_through(autojump_clock: MockClock) -> None:
    fake = FakeCluster()
    backend = await warmed(fake, wait_replicas=1)
    key = fake.key_on(N1)
    fake.move(key_slot(key), N3)
    # The old owner answers MOVED and, a replica now, refuses WAIT: nothing was written
    # there, so the redirect is followed.
    fake.nodes[N1].acks = CommandError("ERR WAIT cannot be used with replica instances")
    assert await backend.execute([("SET", key, "v")]) == [b"OK"]
    assert fake.nodes[N3].data[key.encode()] == b"v"


async def test_every_node_down_fails_the_whole_pipeline(autojump_clock: MockClock) -> None:
    fake = FakeCluster()
    backend = await warmed(fake)
    for node in fake.nodes.values():
        node.faulty.down = True
    with pytest.raises(BackendUnavailable, match="no cluster node answered"):
        await backend.execute([("GET", fake.key_on(N1)), ("GET", fake.key_on(N3))])


async def test_no_slot_map_no_pipeline(autojump_clock: MockClock) -> None:
    fake = FakeCluster()
    for node in fake.nodes.values():
        node.faulty.down = True
    backend = cluster_backend(fake)
    with pytest.raises(BackendUnavailable, match="no slot map"):
        await backend.execute([("GET", "a")])
    fake.nodes[N2].faulty.down = False  # the second seed answers
    assert await backend.execute([("SET", fake.key_on(N2), "v")]) == [b"OK"]


async def test_a_server_without_cluster_mode_is_unavailable_with_its_reason(
    autojump_clock: MockClock,
) -> None:
    plain = RecordingBackend(respond=lambda wire: CommandError(
        "ERR This instance has cluster support disabled"))

    def factory(url: str, name: str) -> FakeNode:
        node = FakeNode(FakeCluster(), "n1:1", 0.0, True)
        node.faulty = FaultyBackend(plain)
        return node

    backend = ClusterBackend("redis://n1:1", node_backend=factory)
    with pytest.raises(BackendUnavailable, match="cluster support disabled"):
        await backend.execute([("GET", "a")])


async def test_aclose_closes_every_node(autojump_clock: MockClock) -> None:
    fake = FakeCluster()
    backend = await warmed(fake)
    await backend.execute([("GET", fake.key_on(a)) for a in RANGES])
    await backend.aclose()
    assert [n.closed for n in fake.nodes.values()] == [1, 1, 1]


# --------------------------------------------------------------------------- in a batch scope

TOUCH = Script.from_source("touch", "return redis.call('SET', KEYS[1], ARGV[1])")


async def test_a_scope_over_three_nodes_is_one_round_and_one_trace_record(
    autojump_clock: MockClock,
) -> None:
    fake = FakeCluster(delay_s=0.25, scripts_loaded=False)
    backend = await warmed(fake)
    tracer = MemoryTracer()

    async def participant(batch: Batch, address: str) -> object:
        return await batch.call(TOUCH, keys=[fake.key_on(address)], args=["v"], owner=address)

    started = trio.current_time()
    async with open_batch_scope({"default": backend}, tracer=tracer, trace_id="t") as scope:
        ps = [scope.start_participant(participant, scope.batch, a, name=a) for a in RANGES]
    assert [p.result() for p in ps] == [f"EVAL@{a}".encode() for a in RANGES]
    assert scope.statistics().rounds == 1
    # The cluster is one backend: one record per round; the NOSCRIPT retry is one more,
    # carrying all three owners, its EVALs again sent to the three nodes at once.
    records = tracer.records("t")
    assert [(r.backend, sorted(r.owners), r.retry) for r in records] == [
        ("cluster", [N1, N2, N3], False), ("cluster", [N1, N2, N3], True)]
    assert trio.current_time() - started == 0.5
    assert [[c[0] for p in n.pipelines for c in p] for n in fake.nodes.values()] == [
        ["EVALSHA", "EVAL"]] * 3
