"""Identity: who a key is, from memory, else one Redis MGET, else SQL.

Three tiers, each in front of the next:

* **Memory** (``identity_ttl_s``, 60 s): a request whose rows are all here declares
  nothing, so the checks that depend on its identity still join the first round.
* **Redis**: on a miss, ONE ``MGET`` fetches every missing row (the key's bundle: key,
  team, user; the end user; the tags) together with the identity *generation*. All
  identity rows share one hash tag, so the MGET works on Redis Cluster too.
* **SQL**: for rows Redis lacks. Their write-back is declared on the batch and not
  awaited: it rides the request's next round. It is guarded by the generation read
  with the MGET, so a row read before an admin change is never written back after it.

A change made through the admin API takes effect everywhere within a second: the admin
path bumps the generation, deletes the affected Redis rows and publishes
``<kind>:<id>`` on a channel every process subscribes to (:meth:`IdentityResolver.run`),
which drops its memory entries. While the subscription is down, memory entries live at
most one second, so the promise holds without it.

An announcement that cannot be made (Redis briefly unreachable, or SQL for a team's keys)
is not dropped: it waits in an outbox that :meth:`IdentityResolver.run` retries (0.1 s
doubling to 1 s) until Redis takes it, so a key blocked during a Redis blip is refused
everywhere about a second after Redis is back, not when caches expire minutes later.
Shutdown tries once more (:meth:`IdentityResolver.wait_announced`, within the grace
period); what a killed process still held is lost, and caches expire as before.

Expired entries are kept (until evicted) as *hints*: a refresh after 60 s already
knows the key's tags, so it needs one MGET, never two. Only a key never seen by this
process, whose own tags have budgets, costs a second MGET for those tags.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, final

import attrs
import cattrs
import orjson
import trio

from triogate.batch import BackendUnavailable, BatchError, Script
from triogate.errors import StoreError
from triogate.governance.decisions import Rejected
from triogate.governance.from_rows import (
    end_user_principal,
    key_principal,
    member_principal,
    tag_principal,
    team_principal,
    user_principal,
)
from triogate.governance.keys import (
    IDENTITY_CHANNEL,
    identity_generation,
    identity_row,
)
from triogate.governance.principals import Identity, Principal
from triogate.store.records import hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping, Sequence
    from contextlib import AbstractAsyncContextManager

    from triogate.batch import Backend, Batch, Subscription
    from triogate.store import KeyRow, Store

logger = logging.getLogger("triogate.governance.identity")

OWNER = "auth"
STORE = Script.from_package("triogate.lua", "identity_store.lua")
#: Memory entries live at most this long while the invalidation channel is down.
UNSUBSCRIBED_TTL_S = 1.0
#: Retry delays of announcements that could not be made (doubling).
OUTBOX_BACKOFF_S = (0.1, 1.0)

_converter = cattrs.Converter()
_MISSING = "missing"


@final
@attrs.frozen(kw_only=True)
class KeyBundle:
    """A key with what it belongs to, cached as one row (one MGET entry)."""

    key: Principal
    team_id: str | None = None
    user_id: str | None = None
    key_tags: tuple[str, ...] = ()
    team: Principal | None = None
    user: Principal | None = None
    #: Tags a request of this key may name and be charged to (see :func:`allowed_tags`).
    allowed_tags: tuple[str, ...] = ()
    #: The key's user's limits inside the key's team, when the membership has any.
    member: Principal | None = None


def allowed_tags(key_tags: Sequence[str], *metadata: Mapping[str, Any] | None
                 ) -> tuple[str, ...]:
    """The tags a key's requests may carry when those tags have budgets or limits.

    LiteLLM's places: the key's ``tags``, and ``metadata.tags`` of the key and its team.
    A client names request tags itself (``metadata.tags``), so without this set any
    caller could spend another tenant's tag budget or lock it out.
    """
    out = list(key_tags)
    for meta in metadata:
        tags = (meta or {}).get("tags")
        if isinstance(tags, list):
            out += [t for t in tags if isinstance(t, str)]
    return tuple(dict.fromkeys(out))


Row = KeyBundle | Principal | None  # None: known not to exist


def encode_row(row: Row) -> bytes:
    """JSON for Redis (a ``missing`` marker for rows known not to exist)."""
    if row is None:
        return orjson.dumps({_MISSING: True})
    return orjson.dumps(_converter.unstructure(row))


def decode_row(kind: str, raw: bytes) -> Row:
    """The inverse of :func:`encode_row` for a row of ``kind``."""
    data = orjson.loads(raw)
    if data.get(_MISSING):
        return None
    if kind == "key":
        return _converter.structure(data, KeyBundle)
    return _converter.structure(data, Principal)


@attrs.define
class _Entry:
    row: Row
    expires_at: float


def _secret_hashes(row: KeyRow) -> list[str]:
    """The hashes a key may be remembered under: its id, its secret, its previous one."""
    return [h for h in (row.token_hash, row.secret_hash, row.previous_secret_hash) if h]


def _until(key: Principal, ends_ms: int | None) -> Principal:
    """``key`` as reached through a secret that stops working at ``ends_ms`` (a previous
    secret in its grace period), which then answers as an expired key."""
    if ends_ms is None or (key.expires_ms is not None and key.expires_ms <= ends_ms):
        return key
    return attrs.evolve(key, expires_ms=ends_ms)


def governed(principal: Principal) -> bool:
    """Whether charging a request to ``principal`` spends or counts anything."""
    limits = principal.limits
    return any(v is not None for v in (limits.max_budget_nanousd, limits.rpm, limits.tpm,
                                       limits.max_parallel))


def _reject(status: int, reason: str, message: str) -> Rejected:
    return Rejected(
        check="auth", reason=reason, message=message, status=status,
        error_type="authentication_error" if status == 401 else "permission_error",
    )


class IdentityResolver:
    """Resolves keys to identities with a memory cache in front of Redis and SQL.

    Args:
        store: the SQL store (source of truth).
        backend: the Redis backend identity rows live in (for admin changes and pub/sub).
        subscribe: opens a subscription (``RespBackend.open_subscription``).
        backend_name: the batch backend name identity commands are declared on.
        ttl_s: how long a row stays fresh in memory.
        redis_ttl_s: how long a written-back row lives in Redis.
        negative_ttl_s: how long "no such key" is remembered (memory and Redis), so that
            random keys cannot hammer SQL.
        max_entries: bound on memory entries (least recently used go first).
        max_unknown_tags: bound on remembered tags that do not exist. Clients name
            request tags freely; without their own bound, made-up tags would push real
            rows out (and each costs memory): they live in a smaller LRU of their own.
    """

    def __init__(
        self,
        store: Store,
        backend: Backend,
        subscribe: Callable[[str], AbstractAsyncContextManager[Subscription]],
        *,
        backend_name: str = "identity",
        ttl_s: float = 60.0,
        redis_ttl_s: float = 300.0,
        negative_ttl_s: float = 10.0,
        max_entries: int = 100_000,
        max_unknown_tags: int = 10_000,
    ) -> None:
        self._store = store
        self._backend = backend
        self._subscribe = subscribe
        self._backend_name = backend_name
        self._ttl_s = ttl_s
        self._redis_ttl_ms = int(redis_ttl_s * 1000)
        self._negative_ttl_s = negative_ttl_s
        self._max = max_entries
        self._memory: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._max_unknown_tags = max_unknown_tags
        self._unknown_tags: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        # A rotated key is remembered under its secret's hash, not its id: id → those
        # hashes, so that forgetting the key by id drops them (no scan of memory).
        self._by_secret: dict[str, set[str]] = {}
        self._subscribed = False
        # Changes not announced yet (an ordered set): retried by run().
        self._outbox: dict[tuple[str, str], None] = {}
        self._outbox_wake = trio.Event()
        self.sql_loads = 0
        self.redis_reads = 0

    # ------------------------------------------------------------------ memory

    def _ttl(self, row: Row) -> float:
        ttl = self._ttl_s if row is not None else min(self._ttl_s, self._negative_ttl_s)
        return ttl if self._subscribed else min(ttl, UNSUBSCRIBED_TTL_S)

    def _table(self, kind: str, row: Row) -> tuple[OrderedDict[tuple[str, str], _Entry], int]:
        if kind == "tag" and row is None:
            return self._unknown_tags, self._max_unknown_tags
        return self._memory, self._max

    def _remember(self, kind: str, ident: str, row: Row) -> None:
        self._memory.pop((kind, ident), None)
        self._unknown_tags.pop((kind, ident), None)
        table, bound = self._table(kind, row)
        table[(kind, ident)] = _Entry(row, trio.current_time() + self._ttl(row))
        while len(table) > bound:
            table.popitem(last=False)
        if isinstance(row, KeyBundle) and row.key.id != ident:
            if len(self._by_secret) >= bound:  # hints only: stale ones are harmless
                self._by_secret.clear()
            self._by_secret.setdefault(row.key.id, set()).add(ident)

    def _get(self, kind: str, ident: str) -> _Entry | None:
        entry = self._memory.get((kind, ident))
        if entry is None and kind == "tag":
            entry = self._unknown_tags.get((kind, ident))
        return entry

    def _fresh(self, kind: str, ident: str) -> _Entry | None:
        entry = self._get(kind, ident)
        if entry is None or entry.expires_at <= trio.current_time():
            return None
        return entry

    def _hint(self, kind: str, ident: str) -> Row:
        entry = self._get(kind, ident)
        return entry.row if entry is not None else None

    def known(self, raw_key: str) -> bool | None:
        """What memory says of ``raw_key`` without a wait: True for a key it holds fresh,
        False for one it knows, fresh, not to exist, None when only Redis can say."""
        entry = self._fresh("key", hash_key(raw_key))
        return None if entry is None else entry.row is not None

    def memory_entries(self) -> tuple[int, int]:
        """How many rows memory holds: (known rows and keys, unknown tags)."""
        return len(self._memory), len(self._unknown_tags)

    def expire(self) -> None:
        """Make every memory entry stale now, keeping it as a hint (as 60 s would).

        For the round-trip harness and tests: the next request refreshes from Redis.
        """
        for entry in (*self._memory.values(), *self._unknown_tags.values()):
            entry.expires_at = 0.0

    def forget(self, kind: str, ident: str) -> None:
        """Drop memory entries for ``kind:ident`` (and the keys of a team or user)."""
        if kind == "*":
            self._memory.clear()
            self._unknown_tags.clear()
            self._by_secret.clear()
            return
        self._memory.pop((kind, ident), None)
        self._unknown_tags.pop((kind, ident), None)
        if kind == "key":  # remembered by its secret's hash, which may not be its id
            for secret in self._by_secret.pop(ident, ()):
                self._memory.pop(("key", secret), None)
        if kind in ("team", "user"):
            stale = [
                k for k, e in self._memory.items()
                if k[0] == "key" and isinstance(e.row, KeyBundle)
                and (e.row.team_id if kind == "team" else e.row.user_id) == ident
            ]
            for k in stale:
                del self._memory[k]

    # ------------------------------------------------------------------ resolving

    async def resolve(
        self, batch: Batch, raw_key: str, *, group: str | None, end_user: str | None,
        tags: Sequence[str], now_ms: int,
        providers: Callable[[], frozenset[str]] = frozenset,
    ) -> Identity | Rejected:
        """The identity of ``raw_key`` for this request, or why it is refused.

        ``providers`` gives the providers of ``group``'s deployments (for ``openai/*``
        entries in a ``models`` list); called only when such an entry is met.

        A checkpoint. Declares nothing when every row is fresh in memory; else one MGET
        (and SQL reads, whose write-back rides the next round).

        Raises:
            StoreError: SQL was needed and failed.
        """
        key_hash = hash_key(raw_key)
        hint = self._hint("key", key_hash)
        key_tags = hint.key_tags if isinstance(hint, KeyBundle) else ()
        wanted = [("key", key_hash)]
        if end_user:
            wanted.append(("end_user", end_user))
        wanted += [("tag", t) for t in dict.fromkeys((*tags, *key_tags))]
        rows = await self._rows(batch, wanted)
        bundle = rows[("key", key_hash)]
        if isinstance(bundle, KeyBundle):
            extra = [("tag", t) for t in bundle.key_tags if ("tag", t) not in rows]
            if extra:  # a key this process never saw, whose own tags were unknown
                rows.update(await self._rows(batch, extra))
        else:
            await trio.lowlevel.checkpoint()
        return self._identity(rows, key_hash, group, end_user, tags, now_ms, providers)

    async def resolve_end_user(self, batch: Batch, identity: Identity, end_user: str
                               ) -> Identity | Rejected:
        """``identity`` (the master key's) with the end user's principal, so that the end
        user's budget and limits apply to master-key requests too.

        Costs what a key's end user costs: nothing when the row is in memory, else one
        MGET (and SQL, whose write-back rides the next round). A blocked end user is 403.

        Raises:
            StoreError: SQL was needed and failed.
        """
        rows = await self._rows(batch, [("end_user", end_user)])
        end = rows.get(("end_user", end_user))
        if not isinstance(end, Principal):
            return identity
        if end.blocked:
            return _reject(403, "end_user_blocked",
                           f"end user '{end.alias or end.id}' is blocked")
        return attrs.evolve(identity, end_user=end)

    async def _rows(self, batch: Batch, wanted: list[tuple[str, str]]
                    ) -> dict[tuple[str, str], Row]:
        rows: dict[tuple[str, str], Row] = {}
        missing: list[tuple[str, str]] = []
        for kind, ident in wanted:
            entry = self._fresh(kind, ident)
            if entry is None:
                missing.append((kind, ident))
            else:
                rows[(kind, ident)] = entry.row
                table, _ = self._table(kind, entry.row)
                table.move_to_end((kind, ident))
        if not missing:
            return rows
        generation: bytes | None = None
        redis_answered = False
        found: dict[tuple[str, str], Row] = {}
        try:
            self.redis_reads += 1
            reply = await batch.call(
                "MGET", keys=[identity_generation(), *(identity_row(k, i) for k, i in missing)],
                backend=self._backend_name, owner=OWNER,
            )
            generation, values = reply[0], reply[1:]
            redis_answered = True
            for (kind, ident), raw in zip(missing, values, strict=True):
                if raw is not None:
                    found[(kind, ident)] = decode_row(kind, raw)
        except (BatchError, ValueError, cattrs.BaseValidationError) as exc:
            logger.warning("identity rows unreadable from Redis (%s): using SQL", exc)
            generation = None
        from_sql = [m for m in missing if m not in found]
        if from_sql:
            loaded = await self._load(from_sql)
            found.update(loaded)
            if redis_answered:
                self._write_back(batch, loaded, generation)
        for (kind, ident), row in found.items():
            self._remember(kind, ident, row)
        rows.update(found)
        return rows

    async def _load(self, wanted: list[tuple[str, str]]) -> dict[tuple[str, str], Row]:
        """SQL for rows Redis lacks (a few queries, each in a worker thread)."""
        self.sql_loads += 1
        by_kind: dict[str, list[str]] = {}
        for kind, ident in wanted:
            by_kind.setdefault(kind, []).append(ident)
        out: dict[tuple[str, str], Row] = {}
        if "key" in by_kind:
            # By the secret's hash: a rotated key's id (token_hash) is not its secret's.
            secrets = await self._store.keys_by_secret(by_kind["key"])
            keys = {h: row for h, (row, _) in secrets.items()}
            teams = await self._store.get_teams(
                sorted({r.team_id for r in keys.values() if r.team_id}))
            users = await self._store.get_users(
                sorted({r.user_id for r in keys.values() if r.user_id}))
            members = {(m.team_id, m.user_id): m for m in await self._store.team_memberships(
                sorted({(r.team_id, r.user_id) for r in keys.values()
                        if r.team_id and r.user_id}))}
            for key_hash in by_kind["key"]:
                row = keys.get(key_hash)
                team_row = teams.get(row.team_id) if row is not None and row.team_id else None
                member = members.get((row.team_id, row.user_id)) if row is not None and (
                    row.team_id and row.user_id) else None
                out[("key", key_hash)] = None if row is None else KeyBundle(
                    key=_until(key_principal(row), secrets[key_hash][1]),
                    team_id=row.team_id,
                    user_id=row.user_id,
                    key_tags=tuple(row.tags),
                    team=team_principal(team_row) if team_row is not None else None,
                    user=user_principal(users[row.user_id]) if row.user_id in users else None,
                    allowed_tags=allowed_tags(row.tags, row.metadata,
                                              team_row.metadata if team_row else None),
                    member=member_principal(member, team_row)
                    if member is not None and member.limited and team_row is not None
                    else None,
                )
        if "end_user" in by_kind:
            end_users = await self._store.get_end_users(by_kind["end_user"])
            for ident in by_kind["end_user"]:
                end_row = end_users.get(ident)
                out[("end_user", ident)] = None if end_row is None else end_user_principal(
                    end_row)
        if "tag" in by_kind:
            tags = await self._store.get_tags(by_kind["tag"])
            for ident in by_kind["tag"]:
                tag_row = tags.get(ident)
                out[("tag", ident)] = None if tag_row is None else tag_principal(tag_row)
        return out

    def _write_back(self, batch: Batch, loaded: dict[tuple[str, str], Row],
                    generation: bytes | None) -> None:
        """Declare the guarded write-back; it leaves with the request's next round."""
        if not loaded:
            return
        items = list(loaded.items())
        ttls = {self._redis_ttl_ms if row is not None else int(self._negative_ttl_s * 1000)
                for _, row in items}
        batch.call(
            STORE,
            keys=[identity_generation(), *(identity_row(k, i) for (k, i), _ in items)],
            args=[generation or b"", min(ttls), *(encode_row(row) for _, row in items)],
            backend=self._backend_name, owner=OWNER,
        )

    def _identity(
        self, rows: dict[tuple[str, str], Row], key_hash: str, group: str | None,
        end_user: str | None, tags: Sequence[str], now_ms: int,
        providers: Callable[[], frozenset[str]],
    ) -> Identity | Rejected:
        bundle = rows[("key", key_hash)]
        if not isinstance(bundle, KeyBundle):
            return _reject(401, "invalid_key", "invalid API key")
        key = bundle.key
        if key.blocked:
            return _reject(401, "key_blocked", "this API key is blocked")
        if key.expires_ms is not None and key.expires_ms <= now_ms:
            return _reject(401, "key_expired", "this API key has expired")
        end = rows.get(("end_user", end_user)) if end_user else None
        for party in (bundle.team, bundle.user, end):
            if isinstance(party, Principal) and party.blocked:
                label = party.kind.replace("_", " ")
                return _reject(403, f"{party.kind}_blocked",
                               f"{label} '{party.alias or party.id}' is blocked")
        for tag in tags:
            row = rows.get(("tag", tag))
            if (isinstance(row, Principal) and governed(row)
                    and tag not in bundle.allowed_tags):
                return _reject(403, "tag_not_allowed",
                               f"this key may not use tag '{tag}' (it has a budget or "
                               "limits, and is not among the key's or team's tags)")
        tag_rows = [rows.get(("tag", t)) for t in dict.fromkeys((*tags, *bundle.key_tags))]
        identity = Identity(
            key=key,
            team=bundle.team,
            user=bundle.user,
            end_user=end if isinstance(end, Principal) else None,
            tags=tuple(t for t in tag_rows if isinstance(t, Principal)),
            member=bundle.member,
        )
        if group is not None:
            party = identity.first_refusing(group, providers=providers)
            if party is not None:
                return _reject(
                    403, "model_not_allowed",
                    f"{party.kind} '{party.alias or party.id}' may not use model '{group}'",
                )
        return identity

    # ------------------------------------------------------------------ changes

    async def announce(self, *changes: tuple[str, str]) -> None:
        """After an admin change in SQL: make every process see it within a second.

        Bumps the generation (so no stale write-back lands), deletes the affected Redis
        rows (for a team or user: the bundles of its keys) and publishes each change.
        Also drops this process's memory entries at once.

        Raises:
            BackendUnavailable: Redis did not answer. The change waits in the outbox;
                :meth:`run` announces it once Redis is back.
            StoreError: finding a team's or user's keys failed; likewise retried.
        """
        for kind, ident in changes:
            self.forget(kind, ident)
        try:
            await self._publish(changes)
        except (BackendUnavailable, StoreError):
            for change in changes:
                self._outbox[change] = None
            self._outbox_wake.set()
            raise

    @property
    def unannounced(self) -> int:
        """Changes waiting in the outbox."""
        return len(self._outbox)

    async def wait_announced(self) -> None:
        """Announce what waits in the outbox now, retrying until done (shutdown: bound
        it with the grace period)."""
        delay_s, max_delay_s = OUTBOX_BACKOFF_S
        while not await self._deliver():
            await trio.sleep(delay_s)
            delay_s = min(delay_s * 2, max_delay_s)

    async def _deliver(self) -> bool:
        """One attempt at the outbox; whether it is empty now."""
        changes = tuple(self._outbox)
        if not changes:
            await trio.lowlevel.checkpoint()
            return True
        try:
            await self._publish(changes)
        except (BackendUnavailable, StoreError):
            return False
        for change in changes:
            self._outbox.pop(change, None)
        logger.warning("announced %d admin changes that had waited for Redis", len(changes))
        return not self._outbox

    async def _run_outbox(self) -> None:
        while True:
            while not self._outbox:
                await self._outbox_wake.wait()
                self._outbox_wake = trio.Event()
            # Each attempt is bounded by the backend's command timeout; retried forever.
            await self.wait_announced()

    async def _publish(self, changes: Sequence[tuple[str, str]]) -> None:
        doomed: list[str] = []
        for kind, ident in changes:
            if kind == "key":
                doomed += [identity_row(kind, h) for h in await self._secrets_of(ident)]
            elif kind in ("end_user", "tag"):
                doomed.append(identity_row(kind, ident))
            elif kind in ("team", "user"):
                doomed += [identity_row("key", h) for h in await self._keys_of(kind, ident)]
        commands: list[tuple[Any, ...]] = [("INCR", identity_generation())]
        if doomed:
            commands.append(("DEL", *doomed))
        commands += [("PUBLISH", IDENTITY_CHANNEL, f"{k}:{i}") for k, i in changes]
        await self._backend.execute(commands)

    async def _keys_of(self, kind: str, ident: str) -> list[str]:
        hashes: list[str] = []
        seen = 0
        page = 1
        while True:
            filters = {"team_id": ident} if kind == "team" else {"user_id": ident}
            rows, total = await self._store.list_keys(**filters, page=page, size=500)
            hashes += [h for r in rows for h in _secret_hashes(r)]
            seen += len(rows)
            if seen >= total or not rows:
                return hashes
            page += 1

    async def _secrets_of(self, token_hash: str) -> list[str]:
        """The hashes a key is remembered under: its id and its secrets (a rotated key)."""
        row = (await self._store.get_keys([token_hash])).get(token_hash)
        return [token_hash] if row is None else list(dict.fromkeys(
            (token_hash, *_secret_hashes(row))))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Listen for changes until cancelled; reconnect with backoff when Redis drops.
        Meanwhile, announce what waits in the outbox.

        Each (re)subscription forgets all of memory: messages may have been missed.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run_outbox)
            task_status.started()
            await self._listen()

    async def _listen(self) -> None:
        delay_s = 0.2
        while True:
            try:
                async with self._subscribe(IDENTITY_CHANNEL) as messages:
                    self._memory.clear()
                    self._unknown_tags.clear()
                    self._by_secret.clear()
                    self._subscribed = True
                    delay_s = 0.2
                    await self._consume(messages)
            except BackendUnavailable as exc:
                if self._subscribed:
                    logger.warning("identity invalidation channel lost: %s", exc.reason)
            self._subscribed = False
            await trio.sleep(delay_s)
            delay_s = min(delay_s * 2, 5.0)

    async def _consume(self, messages: AsyncIterator[tuple[bytes, bytes]]) -> None:
        async for _channel, data in messages:
            kind, _, ident = data.decode(errors="replace").partition(":")
            self.forget(kind, ident)
