"""Identity resolution against real Redis and SQL: memory, one MGET, SQL, invalidation."""

from __future__ import annotations

from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import MemoryTracer, open_batch_scope
from triogate.governance.decisions import Rejected
from triogate.governance.identity import IdentityResolver
from triogate.governance.keys import identity_row
from triogate.governance.principals import Identity
from triogate.store import hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.batch import RespBackend
    from triogate.store import Store

pytestmark = pytest.mark.integration

NOW_MS = 1_800_000_000_000


@asynccontextmanager
async def resolver(store: Store, redis: RespBackend, **kwargs: float
                   ) -> AsyncIterator[IdentityResolver]:
    """A resolver with its invalidation listener running (as in the app nursery)."""
    identities = IdentityResolver(store, redis, redis.open_subscription, **kwargs)
    async with trio.open_nursery() as nursery:
        await nursery.start(identities.run)
        while not identities._subscribed:
            await trio.sleep(0.01)
        yield identities
        nursery.cancel_scope.cancel()


async def resolve(identities: IdentityResolver, redis: RespBackend, key: str, *,
                  group: str | None = "gpt", end_user: str | None = None,
                  tags: tuple[str, ...] = ()) -> tuple[Identity | Rejected, int]:
    """Resolve in a batch scope; return the result and the rounds it took."""
    tracer = MemoryTracer()
    async with open_batch_scope({"identity": redis}, tracer=tracer, trace_id="t") as scope:
        who = scope.start_participant(partial(identities.resolve, scope.batch, key,
                                              group=group, end_user=end_user, tags=tags,
                                              now_ms=NOW_MS))
    return who.result(), scope.statistics().rounds


async def test_memory_then_redis_then_sql(store: Store, redis: RespBackend) -> None:
    team = await store.create_team(team_alias="ml", models=("gpt",), rpm_limit=10)
    raw, _ = await store.create_key(team_id=team.team_id, rpm_limit=5, tags=("paid",))
    await store.create_tag(tag="paid", max_budget_nanousd=1000)
    await store.create_end_user(user_id="cust", rpm_limit=3)
    with trio.fail_after(10):
        async with resolver(store, redis) as first:
            identity, rounds = await resolve(first, redis, raw, end_user="cust")
            assert isinstance(identity, Identity)
            assert (identity.team.alias, identity.end_user.id) == ("ml", "cust")  # type: ignore[union-attr]
            assert [t.id for t in identity.tags] == ["paid"]
            # Cold: one MGET, then SQL; the key's own tag needed a second MGET.
            assert rounds == 3 and first.sql_loads == 2
            again, rounds = await resolve(first, redis, raw, end_user="cust")
            assert again == identity and rounds == 0  # memory: nothing declared
        # A second process: memory empty, Redis has the rows written back. It learns the
        # key's own tag from the bundle, so that tag's row costs it a second MGET, once.
        async with resolver(store, redis) as second:
            other, rounds = await resolve(second, redis, raw, end_user="cust")
            assert other == identity
            assert (rounds, second.sql_loads) == (2, 0)
            second.expire()
            _, rounds = await resolve(second, redis, raw, end_user="cust")
            assert rounds == 1  # a refresh: one MGET, tags known from the hint


async def test_refusals(store: Store, redis: RespBackend) -> None:
    team = await store.create_team(team_alias="ml", models=("gpt",))
    blocked_team = await store.create_team(team_alias="frozen", blocked=True)
    ok, _ = await store.create_key(team_id=team.team_id)
    blocked, _ = await store.create_key(blocked=True)
    expired, _ = await store.create_key(expires_at_ms=NOW_MS - 1)
    frozen, _ = await store.create_key(team_id=blocked_team.team_id)
    await store.create_end_user(user_id="banned", blocked=True)
    with trio.fail_after(10):
        async with resolver(store, redis) as identities:
            cases = {
                "sk-unknown": (401, "invalid_key"),
                blocked: (401, "key_blocked"),
                expired: (401, "key_expired"),
                frozen: (403, "team_blocked"),
            }
            for key, (status, reason) in cases.items():
                result, _ = await resolve(identities, redis, key)
                assert isinstance(result, Rejected)
                assert (result.status, result.reason, result.check) == (status, reason, "auth")
            denied, _ = await resolve(identities, redis, ok, group="claude")
            assert isinstance(denied, Rejected) and denied.reason == "model_not_allowed"
            assert "may not use model 'claude'" in denied.message
            banned, _ = await resolve(identities, redis, ok, end_user="banned")
            assert isinstance(banned, Rejected) and banned.reason == "end_user_blocked"


async def test_unknown_keys_are_remembered_so_they_cannot_hammer_sql(
    store: Store, redis: RespBackend
) -> None:
    with trio.fail_after(10):
        async with resolver(store, redis) as identities:
            for _ in range(5):
                result, _ = await resolve(identities, redis, "sk-nobody")
                assert isinstance(result, Rejected)
            assert identities.sql_loads == 1
        async with resolver(store, redis) as other:
            await resolve(other, redis, "sk-nobody")
            assert other.sql_loads == 0  # the negative row was in Redis


async def test_a_change_reaches_another_process_within_a_second(
    store: Store, redis: RespBackend
) -> None:
    raw, row = await store.create_key()
    team = await store.create_team(team_alias="ml")
    raw2, _ = await store.create_key(team_id=team.team_id)
    with trio.fail_after(10):
        async with resolver(store, redis) as a, resolver(store, redis) as b:
            assert isinstance((await resolve(b, redis, raw))[0], Identity)
            assert isinstance((await resolve(b, redis, raw2))[0], Identity)
            await store.update_key(row.token_hash, blocked=True)
            await store.update_team(team.team_id, models=("other",))
            started = trio.current_time()
            await a.announce(("key", row.token_hash), ("team", team.team_id))
            while not isinstance((await resolve(b, redis, raw))[0], Rejected):
                await trio.sleep(0.01)
            while not isinstance((await resolve(b, redis, raw2))[0], Rejected):
                await trio.sleep(0.01)
            assert trio.current_time() - started < 1.0


class ChangedDuringRead:
    """A store whose key read races an admin change: the rows it returns are stale."""

    def __init__(self, store: Store, redis: RespBackend) -> None:
        self._store = store
        self._redis = redis

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def keys_by_secret(self, hashes: list[str]) -> object:
        rows = await self._store.keys_by_secret(hashes)
        for key_hash in hashes:  # the admin path: SQL first, then the generation bump
            await self._store.update_key(key_hash, rpm_limit=1)
        await self._redis.execute([("INCR", "tg:{id}:gen")])
        return rows


async def test_a_stale_write_back_cannot_land_after_an_admin_change(
    store: Store, redis: RespBackend
) -> None:
    raw, _ = await store.create_key(rpm_limit=5)
    racing = ChangedDuringRead(store, redis)
    with trio.fail_after(10):
        async with resolver(racing, redis) as identities:  # type: ignore[arg-type]
            identity, _ = await resolve(identities, redis, raw, group=None)
            assert isinstance(identity, Identity) and identity.key.limits.rpm == 5
        stored = await redis.execute([("GET", identity_row("key", hash_key(raw)))])
        assert stored == [None]  # the stale row was not written back
        async with resolver(store, redis) as fresh:
            identity, _ = await resolve(fresh, redis, raw, group=None)
            assert isinstance(identity, Identity) and identity.key.limits.rpm == 1


async def test_without_the_channel_memory_lives_one_second(store: Store, redis: RespBackend
                                                           ) -> None:
    raw, _ = await store.create_key()
    identities = IdentityResolver(store, redis, redis.open_subscription)  # not listening
    with trio.fail_after(10):
        await resolve(identities, redis, raw)
        _, rounds = await resolve(identities, redis, raw)
        assert rounds == 0
        await trio.sleep(1.05)
        _, rounds = await resolve(identities, redis, raw)
        assert rounds == 1


async def test_a_governed_tag_is_charged_only_when_the_key_or_team_allows_it(
    store: Store, redis: RespBackend
) -> None:
    await store.create_tag(tag="team-y", max_budget_nanousd=1000)
    await store.create_tag(tag="free-label")  # no budget, no limits: a label only
    x = await store.create_team(team_alias="x")
    y = await store.create_team(team_alias="y", metadata={"tags": ["team-y"]})
    outsider, _ = await store.create_key(team_id=x.team_id)
    insider, _ = await store.create_key(team_id=y.team_id)
    own, _ = await store.create_key(metadata={"tags": ["team-y"]})
    with trio.fail_after(10):
        async with resolver(store, redis) as identities:
            refused, _ = await resolve(identities, redis, outsider, tags=("team-y",))
            assert isinstance(refused, Rejected) and refused.status == 403
            assert "team-y" in refused.message and refused.reason == "tag_not_allowed"
            label, _ = await resolve(identities, redis, outsider, tags=("free-label", "new"))
            assert isinstance(label, Identity)
            for raw in (insider, own):
                allowed, _ = await resolve(identities, redis, raw, tags=("team-y",))
                assert isinstance(allowed, Identity)
                assert [t.id for t in allowed.tags] == ["team-y"]


async def test_made_up_tags_are_bounded_in_memory(store: Store, redis: RespBackend) -> None:
    raw, _ = await store.create_key()
    await store.create_tag(tag="real", max_budget_nanousd=1000)
    with trio.fail_after(30):
        async with resolver(store, redis, max_unknown_tags=50) as identities:
            await resolve(identities, redis, raw, tags=())
            for i in range(40):  # 32 tags a request (the HTTP limit), all new
                await resolve(identities, redis, raw,
                              tags=tuple(f"junk-{i}-{j}" for j in range(32)))
            known, unknown = identities.memory_entries()
            assert unknown == 50 and known == 1  # the key stayed; junk never displaced it
            _, rounds = await resolve(identities, redis, raw, tags=())
            assert rounds == 0
