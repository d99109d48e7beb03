"""ClusterBackend: a Redis Cluster as one backend; one pipeline per node, nodes concurrently.

The batch library's promise is one wait per dependency level. On a cluster the commands of
one round live on several nodes; sent one node after another (as coredis's cluster
pipeline does) they would cost one wait *per node*. Here every node's share leaves at
once, one task per node, so the round is still one wait, as long as the slowest node.

How a round is routed (``_slots.py`` has the rules):
    * a keyed command goes to the primary of its keys' slot; keys in several slots get a
      ``CROSSSLOT`` error reply for that command alone, without being sent;
    * a keyless one (PING, PUBLISH, ...) rides a node the round already talks to;
    * ``SCRIPT LOAD``/``FLUSH``/``EXISTS``, ``FLUSHALL``, ``FLUSHDB``, ``FUNCTION ...`` go to
      every primary; the reply is the first primary's (the one serving the lowest slots),
      or the first error; ``SCRIPT EXISTS`` answers 1 only where every primary has it.

Redirections: a ``MOVED`` reply patches the slot map at once and marks it stale; an
``ASK`` reply is followed with ``ASKING`` on the same connection. Either way only the
redirected commands are re-sent, in a second round (one more wait for their owners
only, everyone else's replies are already in hand), at most ``max_redirects`` times.
``TRYAGAIN`` (a multi-key command caught mid-migration) is returned as the reply.

Failures: a node that fails as a whole (refused, reset, timed out) fails only its own
commands, each with its own :class:`BackendUnavailable`; if no node answered at all,
``execute`` raises :class:`BackendUnavailable`, as a single server would. A failed node
pipeline is never re-sent (the node may have executed it): the settler's journal replays
the writes, idempotently, to whoever owns the slots next.

Failover: when a primary dies its commands fail (connection refused, at once) and the map
is marked stale, so the next round refreshes it alongside. Until the cluster promotes a
replica (``cluster-node-timeout`` and an election) the map still names the dead node and
its slots stay unavailable; the first refresh after the promotion names the replica.
Replication is asynchronous: with ``wait_replicas`` each node pipeline ends with
``WAIT n``, and fewer acknowledgements fail it, so that no write the gateway counts as
done lives on one node only.

The slot map comes from ``CLUSTER SLOTS``. The first ``execute`` waits for it; later
refreshes (after a MOVED or a node failure, at most once per ``min_refresh_interval_s``)
run concurrently with a round, so they add no wait.

Bounds: every node pipeline and every map request is bounded by ``command_timeout_s``
(the per-node :class:`RespBackend` enforces it). One ``execute`` makes at most
``1 + max_redirects`` rounds, plus, the first time, one map request per known node.
"""

from __future__ import annotations

import logging
import math
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Protocol, final
from urllib.parse import urlsplit

import attrs
import trio

from ._backend import redact_url
from ._cluster_map import (
    CLUSTER_SCHEMES,
    MAX_REMEMBERED_SCRIPTS,
    cluster_seeds,
    is_script_load,
    node_url,
    parse_slots,
    redirect_of,
)
from ._errors import BackendUnavailable, CommandError
from ._fusion import Fuser
from ._resp import RespBackend, TlsContext
from ._slots import SLOTS, Spread, command_name, command_slot, key_slot

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence
    from contextlib import AbstractAsyncContextManager

    from ._backend import Wire
    from ._command import Arg
    from ._resp import Subscription

logger = logging.getLogger("triogate.batch")

_ASKING: Wire = ("ASKING",)
_CROSSSLOT = "CROSSSLOT Keys in request don't hash to the same slot"


class NodeBackend(Protocol):
    """What the cluster backend needs of the client of one node (a RespBackend, or a fake)."""

    @property
    def name(self) -> str: ...

    async def execute(self, commands: Sequence[Wire]) -> list[object]: ...

    def open_subscription(self, *channels: str) -> AbstractAsyncContextManager[Subscription]: ...

    async def aclose(self) -> None: ...


@final
@attrs.frozen(kw_only=True)
class ClusterStatistics:
    """Counters of one cluster backend since it was created.

    The first five fields mean what they mean on :class:`BackendStatistics`, summed over
    the nodes, so code reading a backend's statistics needs no special case.

    Attributes:
        pipelines: ``execute`` calls with commands (one per round, whatever the nodes).
        commands: commands given to ``execute``.
        failures: node pipelines that failed as a whole.
        connections_open: open connections, all nodes.
        connections_idle: idle connections, all nodes.
        nodes: primaries in the current slot map.
        node_pipelines: pipelines sent to nodes (a round to three nodes counts three).
        redirects: MOVED and ASK replies followed.
        slot_map_refreshes: slot maps fetched.
    """

    pipelines: int
    commands: int
    failures: int
    connections_open: int
    connections_idle: int
    nodes: int
    node_pipelines: int
    redirects: int
    slot_map_refreshes: int


@attrs.frozen
class _Entry:
    index: int
    wire: Wire
    asking: bool = False
    broadcast: bool = False


_Groups = dict[str, list[_Entry]]
_Result = list[object] | BackendUnavailable


@final
class ClusterBackend:
    """A Redis Cluster behind the :class:`Backend` protocol; see the module docstring.

    A drop-in for :class:`RespBackend`: ``name``, ``execute``, ``statistics``, ``aclose``
    and ``open_subscription``. The tracer sees one pipeline per round for it (it is one
    backend); :meth:`statistics` counts the node pipelines underneath.

    Args:
        url_or_seeds: ``redis+cluster://h1:p1,h2:p2`` (``rediss+cluster`` for TLS), one
            ``redis://`` URL, or a sequence of them: nodes to ask for the slot map.
            Credentials and TLS apply to every node.
        name: label for traces and errors.
        pool_size: most connections open at once, per node.
        command_timeout_s: bound on one node pipeline (pool wait + connect + round trip).
        max_idle_s: a node's pooled connection idle for longer is closed, not reused.
        max_redirects: how many times one ``execute`` follows MOVED/ASK (each a round).
        min_refresh_interval_s: least time between two slot-map refreshes.
        node_backend: ``(url, name) -> NodeBackend``; default a :class:`RespBackend`.
            Tests pass fakes or wrappers here.
        fuse_scripts: fuse the script calls of a round whose keys share a slot into one
            ``EVALSHA`` (``_fusion.py``); False sends one ``EVALSHA`` per call.
        wait_replicas: replicas of a node that must acknowledge each node pipeline
            (``WAIT n`` at its end, within half of ``command_timeout_s``); a pipeline
            fewer acknowledged fails as a whole, like a node that did not answer. 0: none.

    Raises:
        ValueError: the seeds cannot be parsed (see :func:`cluster_seeds`).
    """

    def __init__(
        self,
        url_or_seeds: str | Sequence[str],
        *,
        name: str = "redis",
        pool_size: int = 32,
        command_timeout_s: float = 0.5,
        max_idle_s: float = 30.0,
        max_redirects: int = 3,
        min_refresh_interval_s: float = 1.0,
        node_backend: Callable[[str, str], NodeBackend] | None = None,
        fuse_scripts: bool = True,
        wait_replicas: int = 0,
    ) -> None:
        seeds = cluster_seeds(url_or_seeds)
        self._wait_replicas = wait_replicas
        self._wait: Wire | None = None
        if wait_replicas:
            self._wait = ("WAIT", wait_replicas, max(1, int(command_timeout_s * 500)))
        self._fuser = Fuser(per_slot=True) if fuse_scripts else None
        self._template = seeds[0]
        self._tls = TlsContext(seeds[0].tls_options) if seeds[0].tls else None
        self._seeds = tuple(f"{s.host}:{s.port}" for s in seeds)
        shown = [url_or_seeds] if isinstance(url_or_seeds, str) else list(url_or_seeds)
        self._url = ",".join(redact_url(u) for u in shown)
        self._name = name
        self._pool_size = pool_size
        self._timeout_s = command_timeout_s
        self._max_idle_s = max_idle_s
        self._max_redirects = max_redirects
        self._min_refresh_s = min_refresh_interval_s
        self._factory = node_backend or self._resp_node
        self._nodes: dict[str, NodeBackend] = {}
        self._slots: list[str | None] | None = None
        self._primaries: tuple[str, ...] = ()
        self._suspect: set[str] = set()
        self._refresh_lock = trio.Lock()
        self._epoch = 0
        self._stale = False
        self._refreshed_at = -math.inf
        self._turn = 0
        self._pipelines = 0
        self._commands = 0
        self._failures = 0
        self._node_pipelines = 0
        self._redirects = 0
        self._refreshes = 0
        #: ``SCRIPT LOAD`` commands sent to every primary, by script: sent again to a
        #: node that becomes a primary (a promoted replica has no scripts: the script
        #: cache is not replicated), so its first rounds need no NOSCRIPT fallback.
        self._scripts: dict[object, Wire] = {}

    @staticmethod
    def is_cluster_url(url: str) -> bool:
        """Whether ``url`` names a cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
        return urlsplit(url).scheme in CLUSTER_SCHEMES

    @property
    def name(self) -> str:
        return self._name

    @property
    def script_fuser(self) -> Fuser | None:
        """How the flush fuses this backend's script calls: per hash slot (one EVALSHA's
        keys must share a slot on a cluster)."""
        return self._fuser

    @property
    def url(self) -> str:
        """The seeds, password redacted."""
        return self._url

    @property
    def nodes(self) -> tuple[str, ...]:
        """``host:port`` of every primary in the slot map, lowest slots first."""
        return self._primaries

    def node_of(self, key: Arg) -> str | None:
        """The primary serving ``key``'s slot in the current map (None before the first map)."""
        return None if self._slots is None else self._slots[key_slot(key)]

    def __repr__(self) -> str:
        return f"ClusterBackend({self._name!r}, {self._url!r})"

    def _resp_node(self, url: str, name: str) -> NodeBackend:
        return RespBackend(url, name=name, pool_size=self._pool_size,
                           command_timeout_s=self._timeout_s, max_idle_s=self._max_idle_s,
                           tls=self._tls)

    def _node(self, address: str) -> NodeBackend:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = self._factory(
                node_url(self._template, address), f"{self._name}@{address}")
        return node

    # ------------------------------------------------------------------ execute

    async def execute(self, commands: Sequence[Wire]) -> list[object]:
        """Send ``commands``: one pipeline per node, all nodes at once; replies in order.

        A MOVED/ASK reply sends that command again, in a second round of only the
        redirected commands (at most ``max_redirects`` rounds more). See the module
        docstring for routing, failures and bounds.

        Raises:
            BackendUnavailable: no slot map could be had, or every node failed.

        A checkpoint.
        """
        if not commands:
            await trio.lowlevel.checkpoint()
            return []
        self._pipelines += 1
        self._commands += len(commands)
        if self._slots is None:
            await self._refresh(self._epoch)
        replies: list[object] = [None] * len(commands)
        groups, everywhere = self._plan(commands, replies)
        primaries = self._primaries
        spread: dict[int, dict[str, object]] = {i: {} for i in everywhere}
        tried = answered = False
        refresh = self._refresh_due()
        for attempt in range(self._max_redirects + 1):
            if not groups:
                break
            tried = True
            results = await self._send_round(groups, refresh=refresh)
            follow = attempt < self._max_redirects
            groups, any_answer = self._collect(groups, results, replies, spread, follow=follow)
            answered = answered or any_answer
            # A MOVED (or a failed node) made the map stale: refresh alongside the retry.
            refresh = bool(groups) and self._refresh_due()
        if not tried:
            await trio.lowlevel.checkpoint()  # every command was refused without sending
        elif not answered:
            reasons = dict.fromkeys(r.reason for r in replies
                                    if isinstance(r, BackendUnavailable))
            raise BackendUnavailable(self._name, "no cluster node answered: "
                                     + "; ".join(list(reasons)[:3]))
        for i, per_node in spread.items():
            replies[i] = self._merge(commands[i], [per_node[a] for a in primaries])
        return replies

    def _collect(
        self,
        groups: _Groups,
        results: dict[str, _Result],
        replies: list[object],
        spread: dict[int, dict[str, object]],
        *,
        follow: bool,
    ) -> tuple[_Groups, bool]:
        """Put a round's replies in place; return the commands to redirect, and whether
        any node answered. ``follow=False`` (the last round) keeps MOVED/ASK as replies."""
        redirected: _Groups = {}
        answered = False
        for address, entries in groups.items():
            result = results[address]
            if isinstance(result, BackendUnavailable):
                for e in entries:
                    if e.broadcast:
                        spread[e.index][address] = result
                    else:
                        replies[e.index] = self._unavailable(address, result)
                continue
            answered = True
            for e, reply in zip(entries, result, strict=True):
                moved = redirect_of(reply, address) if follow and not e.broadcast else None
                if e.broadcast:
                    spread[e.index][address] = reply
                elif moved is None:
                    replies[e.index] = reply
                else:
                    ask, slot, target = moved
                    self._redirects += 1
                    if not ask and self._slots is not None:
                        self._slots[slot] = target  # right at once; the refresh confirms
                        self._stale = True
                    redirected.setdefault(target, []).append(attrs.evolve(e, asking=ask))
        return redirected, answered

    def _plan(self, commands: Sequence[Wire], replies: list[object]) -> tuple[_Groups, list[int]]:
        """Group commands by node; fill ``replies`` for those refused without sending."""
        assert self._slots is not None
        groups: _Groups = {}
        keyless: list[int] = []
        everywhere: list[int] = []
        for i, wire in enumerate(commands):
            slot = command_slot(wire)
            if slot is Spread.CROSSSLOT:
                replies[i] = CommandError(_CROSSSLOT)
            elif slot is Spread.UNSUPPORTED:
                replies[i] = CommandError(f"ERR {command_name(wire)} is not supported on a "
                                          "cluster backend (commands are regrouped by node)")
            elif slot is Spread.ALL:
                everywhere.append(i)
                if is_script_load(wire) and len(self._scripts) < MAX_REMEMBERED_SCRIPTS:
                    self._scripts[wire[2]] = wire
                for address in self._primaries:
                    groups.setdefault(address, []).append(_Entry(i, wire, broadcast=True))
            elif slot is Spread.ANY:
                keyless.append(i)
            else:
                owner = self._slots[slot]
                if owner is None:  # an unserved slot: any node answers, or redirects
                    self._stale = True
                    keyless.append(i)
                else:
                    groups.setdefault(owner, []).append(_Entry(i, wire))
        if keyless:
            # Ride a node the round already talks to: no extra connection, no extra node.
            rider = next((a for a in groups if a not in self._suspect), None)
            entries = groups.setdefault(rider or self._any_node(), [])
            entries += [_Entry(i, commands[i]) for i in keyless]
        return groups, everywhere

    def _any_node(self) -> str:
        healthy = [a for a in self._primaries if a not in self._suspect] or list(self._primaries)
        self._turn += 1
        return healthy[self._turn % len(healthy)]

    def _unavailable(self, address: str, error: BackendUnavailable) -> BackendUnavailable:
        fresh = BackendUnavailable(self._name, f"node {address}: {error.reason}")
        fresh.__cause__ = error
        return fresh

    def _merge(self, wire: Wire, replies: list[object]) -> object:
        """One reply for a command sent to every primary."""
        for reply in replies:
            if isinstance(reply, BackendUnavailable):
                return BackendUnavailable(self._name, f"on one primary: {reply.reason}")
        for reply in replies:
            if isinstance(reply, Exception):
                return reply
        if command_name(wire) == "SCRIPT" and all(isinstance(r, list) for r in replies):
            # A script exists for the cluster only if every primary has it.
            return [min(flags) for flags in zip(*replies, strict=True)]
        return replies[0]

    async def _send_round(self, groups: _Groups, *, refresh: bool) -> dict[str, _Result]:
        results: dict[str, _Result] = {}
        if len(groups) == 1 and not refresh:
            ((address, entries),) = groups.items()
            results[address] = await self._send_node(address, entries)
            return results

        async def send(address: str, entries: list[_Entry]) -> None:
            results[address] = await self._send_node(address, entries)

        async with trio.open_nursery() as nursery:
            for address, entries in groups.items():
                nursery.start_soon(send, address, entries)
            if refresh:
                nursery.start_soon(self._refresh_quietly, self._epoch)
        return results

    async def _send_node(self, address: str, entries: list[_Entry]) -> _Result:
        wires: list[Wire] = []
        for e in entries:
            if e.asking:
                wires.append(_ASKING)
            wires.append(e.wire)
        if self._wait is not None:
            wires.append(self._wait)
        self._node_pipelines += 1
        try:
            replies = await self._node(address).execute(wires)
            if len(replies) != len(wires):
                raise BackendUnavailable(address, "reply count does not match the pipeline")
        except BackendUnavailable as exc:
            self._failures += 1
            self._suspect.add(address)
            self._stale = True
            return exc
        self._suspect.discard(address)
        if self._wait is not None:
            del wires[-1]
            acked = replies.pop()
            # A node that redirected everything wrote nothing (a replica refuses WAIT).
            moved_all = all(redirect_of(r, address) for r in replies)
            if not moved_all and (not isinstance(acked, int) or acked < self._wait_replicas):
                # A replica is missing or lagging; perhaps a failover is under way.
                self._failures += 1
                self._stale = True
                return BackendUnavailable(
                    address, f"{acked!r} of {self._wait_replicas} replicas acknowledged")
        if len(wires) == len(entries):
            return replies
        out: list[object] = []
        position = 0
        for e in entries:
            position += e.asking  # the ASKING reply ("OK") is nobody's
            out.append(replies[position])
            position += 1
        return out

    # ------------------------------------------------------------------ slot map

    def _refresh_due(self) -> bool:
        return (
            self._stale
            and not self._refresh_lock.locked()
            and trio.current_time() - self._refreshed_at >= self._min_refresh_s
        )

    async def _refresh_quietly(self, seen_epoch: int) -> None:
        try:
            await self._refresh(seen_epoch)
        except BackendUnavailable as exc:
            logger.warning("cluster %s: slot map refresh failed: %s", self._name, exc.reason)

    async def _refresh(self, seen_epoch: int) -> None:
        """Fetch the slot map from the first node that gives it (healthy nodes first).

        Concurrent callers share one fetch: whoever finds the epoch moved on returns.

        Raises:
            BackendUnavailable: no node gave a slot map.
        """
        async with self._refresh_lock:
            if self._epoch != seen_epoch and self._slots is not None:
                return
            self._refreshed_at = trio.current_time()
            known = list(dict.fromkeys((*self._primaries, *self._seeds)))
            order = [a for a in known if a not in self._suspect] + [
                a for a in known if a in self._suspect]
            reasons: list[str] = []
            for address in order:
                try:
                    (reply,) = await self._node(address).execute([("CLUSTER", "SLOTS")])
                    ranges = parse_slots(reply, address)
                except BackendUnavailable as exc:
                    self._suspect.add(address)
                    reasons.append(f"{address}: {exc.reason}")
                    continue
                except (ValueError, TypeError, IndexError) as exc:
                    reasons.append(f"{address}: {exc}")
                    continue
                await self._apply(ranges)
                return
            raise BackendUnavailable(self._name, "no slot map: " + "; ".join(reasons))

    async def _apply(self, ranges: list[tuple[int, int, str]]) -> None:
        table: list[str | None] = [None] * SLOTS
        for first, last, address in ranges:
            table[first : last + 1] = [address] * (last - first + 1)
        self._slots = table
        previous, self._primaries = self._primaries, tuple(
            dict.fromkeys(a for _, _, a in sorted(ranges)))
        self._epoch += 1
        self._refreshes += 1
        # A map that still names a node that failed (a dead primary not yet replaced) is
        # asked for again at the next round, until a replica is promoted in its place.
        self._stale = any(a in self._suspect for a in self._primaries)
        # Clients of nodes that are no longer primaries (failed over, removed, or a seed
        # known by another name) are closed; pipelines in flight on them still finish.
        for address in [a for a in self._nodes if a not in self._primaries]:
            await self._nodes.pop(address).aclose()
        if previous and self._scripts:
            for address in [a for a in self._primaries if a not in previous]:
                await self._load_scripts(address)

    async def _load_scripts(self, address: str) -> None:
        """Send the remembered ``SCRIPT LOAD`` commands to a new primary (best effort: a
        NOSCRIPT later still falls back to EVAL)."""
        try:
            await self._node(address).execute(list(self._scripts.values()))
        except BackendUnavailable as exc:
            logger.warning("cluster %s: could not load scripts on new primary %s: %s",
                           self._name, address, exc.reason)

    # ------------------------------------------------------------------ the rest

    @asynccontextmanager
    async def open_subscription(self, *channels: str) -> AsyncIterator[Subscription]:
        """Subscribe to ``channels`` on one node (a cluster's PUBLISH reaches every node).

        Tries the primaries in turn, healthy ones first. Reads are not bounded by
        ``command_timeout_s``; a lost connection ends iteration with
        :class:`BackendUnavailable` (the caller reconnects, perhaps to another node).

        Raises:
            BackendUnavailable: no node accepted the subscription.
        """
        if self._slots is None:
            await self._refresh(self._epoch)
        order = sorted(self._primaries, key=lambda a: a in self._suspect)
        reasons: list[str] = []
        async with AsyncExitStack() as stack:
            for address in order:
                try:
                    subscription = await stack.enter_async_context(
                        self._node(address).open_subscription(*channels))
                except BackendUnavailable as exc:
                    self._suspect.add(address)
                    reasons.append(f"{address}: {exc.reason}")
                    continue
                yield subscription
                return
            raise BackendUnavailable(self._name, "subscribe: " + "; ".join(reasons))

    def statistics(self) -> ClusterStatistics:
        """Counters since creation; cheap, sync."""
        nodes = [n.statistics() for n in self._nodes.values() if isinstance(n, RespBackend)]
        return ClusterStatistics(
            pipelines=self._pipelines,
            commands=self._commands,
            failures=self._failures,
            connections_open=sum(s.connections_open for s in nodes),
            connections_idle=sum(s.connections_idle for s in nodes),
            nodes=len(self._primaries),
            node_pipelines=self._node_pipelines,
            redirects=self._redirects,
            slot_map_refreshes=self._refreshes,
        )

    async def aclose(self) -> None:
        """Close every node's idle connections; in-flight pipelines finish first."""
        nodes, self._nodes = self._nodes, {}
        for node in nodes.values():
            await node.aclose()
        await trio.lowlevel.checkpoint()
