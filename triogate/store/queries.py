"""The SQL store: :func:`open_store` and the :class:`Store` whose methods the gateway awaits.

SQLAlchemy Core over sqlite3 (the default: ``state_dir/triogate.db``) or sync psycopg 3
(``postgresql://...``, ``postgres://...``). Neither driver speaks trio, so every method
runs its statements in a worker thread (``_threads.py``): each is a checkpoint, none
blocks the event loop, and every database failure surfaces as
:class:`~triogate.errors.StoreError` (never with the password in its message).

SQLite: WAL mode and a busy timeout, so readers never wait for the writer and the
writer waits (rather than fails) for another process. PostgreSQL: a small pool with
``pool_pre_ping``, so connections killed by a restart are replaced, not used.

Keys are stored hashed (:func:`hash_key`); ``create_key`` returns the raw key once.
SQL stays off the request path: identity rows are cached in memory and Redis in front.
"""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, final

import sqlalchemy as sa
import sqlalchemy.exc
import trio

from triogate.errors import StoreError

from . import queries_entities as ent
from . import queries_spend as spend
from ._threads import SqlThreads
from .engine import create_schema, make_engine, parse_url, wall_clock_ms
from .records import TeamMember, key_hint
from .records import generate_key as generate_key
from .records import hash_key as hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence
    from pathlib import Path

    from sqlalchemy.engine import Engine

    from .records import (
        BudgetRow,
        DailySpend,
        EndUserRow,
        KeyRow,
        SpendLogRow,
        SpendTotals,
        TagRow,
        TeamRow,
        UserRow,
    )

Dialect = Literal["sqlite", "postgresql"]


@asynccontextmanager
async def open_store(
    database_url: str | None,
    *,
    state_dir: Path,
    now_ms: Callable[[], int] = wall_clock_ms,
) -> AsyncIterator[Store]:
    """Connect, create the schema if needed, and close the pool on exit.

    Args:
        database_url: ``postgresql://``/``postgres://`` (psycopg 3) or ``sqlite:///PATH``;
            None = a SQLite file ``state_dir/"triogate.db"``.
        state_dir: the gateway's state folder (created if missing, for SQLite).
        now_ms: the wall clock for ``created_at``/``updated_at`` and budget anchors.

    Raises:
        StoreError: bad URL, database unreachable, or the schema could not be created.

    Entering connects and creates the schema (checkpoints); exiting disposes of the pool,
    shielded from cancellation so connections are not leaked.
    """
    url = parse_url(database_url, state_dir)
    threads = SqlThreads(1, secrets=(url.password,) if url.password else ())
    if url.get_backend_name() == "sqlite" and database_url is None:
        await threads.run("create state folder", state_dir.mkdir, 0o700, True, True)
    try:
        engine, max_threads = make_engine(url)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError) as exc:
        raise StoreError(threads.message("create engine", exc)) from exc
    threads = SqlThreads(max_threads, secrets=(url.password,) if url.password else ())
    try:
        await threads.run("create schema", create_schema, engine)
        yield Store._create(engine, threads, now_ms)
    finally:
        with trio.move_on_after(10, shield=True):  # a hung database must not hang exit
            await trio.to_thread.run_sync(engine.dispose, abandon_on_cancel=True)


@final
class Store:
    """The store's queries, as async methods (each a checkpoint; each may raise
    :class:`~triogate.errors.StoreError`). Made by :func:`open_store`.

    Entity methods take the record's field names (see :class:`~.records.KeyRow`);
    ``create_*`` raises :class:`~._threads.StoreConflict` when the id already exists.
    """

    _engine: Engine
    _threads: SqlThreads
    _now_ms: Callable[[], int]

    def __init__(self) -> None:
        raise TypeError("use open_store")

    @classmethod
    def _create(cls, engine: Engine, threads: SqlThreads, now_ms: Callable[[], int]) -> Store:
        self = object.__new__(cls)
        self._engine = engine
        self._threads = threads
        self._now_ms = now_ms
        return self

    @property
    def dialect(self) -> Dialect:
        """``"sqlite"`` or ``"postgresql"``."""
        return "postgresql" if self._engine.dialect.name == "postgresql" else "sqlite"

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (blocking: only for worker threads and tests)."""
        return self._engine

    async def ping(self) -> None:
        """``SELECT 1``, for readiness probes: a caller's deadline holds even when the
        database hangs (the probe's thread is abandoned, see ``SqlThreads.probe``).

        Raises:
            StoreError: the database is unreachable.
        """

        def ping_sync() -> None:
            with self._engine.connect() as conn:
                conn.execute(sa.select(1)).one()

        await self._threads.probe("ping", ping_sync)

    # ------------------------------------------------------------- generic entity calls

    async def _create_entity(self, entity: ent.Entity, fields: dict[str, Any]) -> Any:
        ent.check_fields(entity, fields, allowed=entity.settable | {entity.id_field})
        values = ent.create_values(entity, fields, now_ms=self._now_ms())
        return await self._threads.run(
            f"create {entity.name}", ent.create, self._engine, entity, values
        )

    async def _get(self, entity: ent.Entity, ids: Sequence[str]) -> dict[str, Any]:
        if not ids:
            return {}
        return await self._threads.run(
            f"get {entity.name}s", ent.get_many, self._engine, entity, list(ids)
        )

    async def _update(self, entity: ent.Entity, id_: str, fields: dict[str, Any]) -> Any:
        ent.check_fields(entity, fields, allowed=entity.settable)
        now = self._now_ms()
        return await self._threads.run(
            f"update {entity.name}",
            lambda: ent.update(self._engine, entity, id_, fields, now_ms=now),
        )

    async def _delete(self, entity: ent.Entity, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        return await self._threads.run(
            f"delete {entity.name}s", ent.delete_many, self._engine, entity, list(ids)
        )

    async def _list(
        self, entity: ent.Entity, filters: dict[str, Any], page: int, size: int
    ) -> tuple[list[Any], int]:
        ent.check_page(page, size)
        return await self._threads.run(
            f"list {entity.name}s",
            lambda: ent.list_page(self._engine, entity, filters, page=page, size=size),
        )

    # ------------------------------------------------------------------------- keys

    async def create_key(self, *, raw_key: str | None = None, **fields: Any) -> tuple[str, KeyRow]:
        """Create a key; return the raw key (the only time it is seen) and its row.

        Args:
            raw_key: the key to store (LiteLLM lets admins choose one); default: a new one.
            fields: any settable :class:`KeyRow` field.
        """
        raw = raw_key if raw_key is not None else generate_key()
        fields = {**fields, "token_hash": hash_key(raw)}
        ent.check_fields(ent.KEYS, fields, allowed=ent.KEYS.settable | {"token_hash"})
        values = ent.create_values(ent.KEYS, fields, now_ms=self._now_ms())
        values["key_hint"] = key_hint(raw)
        row = await self._threads.run("create key", ent.create, self._engine, ent.KEYS, values)
        return raw, row

    async def keys_by_secret(self, secret_hashes: Sequence[str]
                             ) -> dict[str, tuple[KeyRow, int | None]]:
        """The key each secret's hash authenticates as, with when that secret stops
        working (a previous secret in its grace period) or None (the current one)."""
        if not secret_hashes:
            return {}
        now = self._now_ms()
        return await self._threads.run("look up key secrets", ent.keys_by_secret,
                                       self._engine, list(secret_hashes), now)

    async def rotate_key(self, token_hash: str, *, raw_key: str | None = None,
                         grace_ms: int = 0, next_rotation_at_ms: int | None = None,
                         due_at_ms: int | None = None
                         ) -> tuple[str, KeyRow, str] | None:
        """A new secret for the key (same id, limits and spend): the raw secret (seen
        only here), the row and the old secret's hash; None if there is no such key (or,
        with ``due_at_ms``, another process rotated it first).

        Raises:
            StoreConflict: ``raw_key`` is already another key's secret.
        """
        raw = raw_key if raw_key is not None else generate_key()
        now = self._now_ms()

        def run() -> tuple[KeyRow, str] | None:
            return ent.rotate_key(self._engine, token_hash, hash_key(raw), key_hint(raw),
                                  grace_ms=grace_ms, now_ms=now,
                                  next_rotation_at_ms=next_rotation_at_ms,
                                  due_at_ms=due_at_ms)

        done = await self._threads.run("rotate key", run)
        return None if done is None else (raw, done[0], done[1])

    async def keys_due_for_rotation(self, *, limit: int = 100) -> list[KeyRow]:
        """Keys with ``auto_rotate`` whose scheduled rotation is due."""
        now = self._now_ms()
        return await self._threads.run("find keys to rotate", ent.keys_due_for_rotation,
                                       self._engine, now, limit)

    async def get_keys(self, token_hashes: Sequence[str]) -> dict[str, KeyRow]:
        """Keys by hash, in one query; hashes not found are absent."""
        return await self._get(ent.KEYS, token_hashes)

    async def update_key(self, token_hash: str, **fields: Any) -> KeyRow | None:
        """Set some fields of a key; None if there is no such key."""
        return await self._update(ent.KEYS, token_hash, fields)  # type: ignore[no-any-return]

    async def delete_keys(self, token_hashes: Sequence[str]) -> int:
        """Delete keys by hash; return how many existed."""
        return await self._delete(ent.KEYS, token_hashes)

    async def list_keys(
        self,
        *,
        team_id: str | None = None,
        user_id: str | None = None,
        key_alias: str | None = None,
        page: int = 1,
        size: int = 100,
    ) -> tuple[list[KeyRow], int]:
        """A page of keys (oldest first) and the total matching the filters."""
        filters = {"team_id": team_id, "user_id": user_id, "key_alias": key_alias}
        return await self._list(ent.KEYS, filters, page, size)

    # ------------------------------------------------------------------------ teams

    async def create_team(
        self, *, members: Sequence[tuple[str, str, str | None]] = (),
        create_users: Sequence[str] = (), **fields: Any,
    ) -> TeamRow:
        """Create a team (``team_id`` defaults to a new UUID) with its ``members``
        ``(user_id, role, email)``, creating ``create_users`` (plain users) that do not
        exist yet: all in one transaction, so that a failure leaves nothing behind.

        Raises:
            StoreConflict: the team exists, or a member is named twice (nothing written).
        """
        fields.setdefault("team_id", str(uuid.uuid4()))
        if not members and not create_users:
            return await self._create_entity(ent.TEAMS, fields)  # type: ignore[no-any-return]
        ent.check_fields(ent.TEAMS, fields, allowed=ent.TEAMS.settable | {ent.TEAMS.id_field})
        now = self._now_ms()
        values = ent.create_values(ent.TEAMS, fields, now_ms=now)
        added = [TeamMember(team_id=fields["team_id"], user_id=u, role=r, user_email=e,
                            created_at_ms=now) for u, r, e in members]
        emails = {u: e for u, _, e in members}
        users = [ent.create_values(ent.USERS, {"user_id": u, "user_email": emails.get(u),
                                               "user_role": "internal_user"}, now_ms=now)
                 for u in create_users]
        return await self._threads.run(
            f"create team '{fields['team_id']}'",
            lambda: ent.create_team(self._engine, values, add=added, create_users=users))

    async def get_teams(self, team_ids: Sequence[str]) -> dict[str, TeamRow]:
        """Teams by id, in one query."""
        return await self._get(ent.TEAMS, team_ids)

    async def update_team(self, team_id: str, **fields: Any) -> TeamRow | None:
        """Set some fields of a team; None if there is no such team."""
        return await self._update(ent.TEAMS, team_id, fields)  # type: ignore[no-any-return]

    async def delete_teams(self, team_ids: Sequence[str]) -> int:
        """Delete teams by id (their keys stay, as in LiteLLM; their memberships go);
        return how many existed."""
        for team_id in team_ids:
            members = (await self.team_members([team_id]))[team_id]
            if members:
                await self.change_team_members(team_id, remove=[m.user_id for m in members])
        return await self._delete(ent.TEAMS, team_ids)

    async def list_teams(self, *, page: int = 1, size: int = 100) -> tuple[list[TeamRow], int]:
        """A page of teams and their total."""
        return await self._list(ent.TEAMS, {}, page, size)

    # ------------------------------------------------------------------------ users

    async def create_user(self, **fields: Any) -> UserRow:
        """Create a user (``user_id`` defaults to a new UUID)."""
        fields.setdefault("user_id", str(uuid.uuid4()))
        return await self._create_entity(ent.USERS, fields)  # type: ignore[no-any-return]

    async def create_user_in_team(self, team_id: str, role: str, **fields: Any) -> UserRow:
        """Create a user and make it a member of ``team_id`` (``role``), in one
        transaction: both, or neither."""
        fields.setdefault("user_id", str(uuid.uuid4()))
        ent.check_fields(ent.USERS, fields, allowed=ent.USERS.settable | {"user_id"})
        now = self._now_ms()
        values = ent.create_values(ent.USERS, fields, now_ms=now)
        member = TeamMember(team_id=team_id, user_id=values["user_id"], role=role,
                            user_email=values.get("user_email"), created_at_ms=now)

        def run() -> UserRow:
            ent.change_members(self._engine, team_id, add=[member], create_users=[values],
                               new_users_only=True)
            row: UserRow = ent.get_many(self._engine, ent.USERS, [member.user_id])[
                member.user_id]
            return row

        return await self._threads.run("create user in team", run)

    async def get_users(self, user_ids: Sequence[str]) -> dict[str, UserRow]:
        """Users by id, in one query."""
        return await self._get(ent.USERS, user_ids)

    async def update_user(self, user_id: str, **fields: Any) -> UserRow | None:
        """Set some fields of a user; None if there is no such user."""
        return await self._update(ent.USERS, user_id, fields)  # type: ignore[no-any-return]

    async def delete_users(self, user_ids: Sequence[str]) -> int:
        """Delete users by id (and their team memberships); return how many existed."""
        for user_id in user_ids:
            for m in await self.memberships(user_id):
                await self.change_team_members(m.team_id, remove=[user_id])
        return await self._delete(ent.USERS, user_ids)

    async def list_users(
        self, *, user_email: str | None = None, page: int = 1, size: int = 100
    ) -> tuple[list[UserRow], int]:
        """A page of users and the total matching the filter."""
        return await self._list(ent.USERS, {"user_email": user_email}, page, size)

    # -------------------------------------------------------------------- end users

    async def create_end_user(self, *, user_id: str, **fields: Any) -> EndUserRow:
        """Create an end user (LiteLLM's customer); the client names it per request."""
        return await self._create_entity(  # type: ignore[no-any-return]
            ent.END_USERS, {**fields, "user_id": user_id}
        )

    async def get_end_users(self, user_ids: Sequence[str]) -> dict[str, EndUserRow]:
        """End users by id, in one query."""
        return await self._get(ent.END_USERS, user_ids)

    async def update_end_user(self, user_id: str, **fields: Any) -> EndUserRow | None:
        """Set some fields of an end user; None if there is none."""
        return await self._update(ent.END_USERS, user_id, fields)  # type: ignore[no-any-return]

    async def delete_end_users(self, user_ids: Sequence[str]) -> int:
        """Delete end users by id; return how many existed."""
        return await self._delete(ent.END_USERS, user_ids)

    async def list_end_users(
        self, *, page: int = 1, size: int = 100
    ) -> tuple[list[EndUserRow], int]:
        """A page of end users and their total."""
        return await self._list(ent.END_USERS, {}, page, size)

    # ------------------------------------------------------------------------- tags

    async def create_tag(self, *, tag: str, **fields: Any) -> TagRow:
        """Create a tag with its own budget and limits."""
        return await self._create_entity(ent.TAGS, {**fields, "tag": tag})  # type: ignore[no-any-return]

    async def get_tags(self, tags: Sequence[str]) -> dict[str, TagRow]:
        """Tags by name, in one query."""
        return await self._get(ent.TAGS, tags)

    async def update_tag(self, tag: str, **fields: Any) -> TagRow | None:
        """Set some fields of a tag; None if there is no such tag."""
        return await self._update(ent.TAGS, tag, fields)  # type: ignore[no-any-return]

    async def delete_tags(self, tags: Sequence[str]) -> int:
        """Delete tags by name; return how many existed."""
        return await self._delete(ent.TAGS, tags)

    async def list_tags(self, *, page: int = 1, size: int = 100) -> tuple[list[TagRow], int]:
        """A page of tags and their total."""
        return await self._list(ent.TAGS, {}, page, size)

    # ---------------------------------------------------------------------- budgets

    async def create_budget(self, *, budget_id: str, **fields: Any) -> BudgetRow:
        """Create a shared budget (LiteLLM's ``/budget/new``)."""
        return await self._create_entity(  # type: ignore[no-any-return]
            ent.BUDGETS, {**fields, "budget_id": budget_id})

    async def get_budgets(self, budget_ids: Sequence[str]) -> dict[str, BudgetRow]:
        """Budgets by id, in one query."""
        return await self._get(ent.BUDGETS, budget_ids)

    async def update_budget(self, budget_id: str, **fields: Any) -> BudgetRow | None:
        """Set some fields of a budget; None if there is none."""
        return await self._update(ent.BUDGETS, budget_id, fields)  # type: ignore[no-any-return]

    async def delete_budgets(self, budget_ids: Sequence[str]) -> int:
        """Delete budgets by id; return how many existed."""
        return await self._delete(ent.BUDGETS, budget_ids)

    async def list_budgets(self, *, page: int = 1, size: int = 100
                           ) -> tuple[list[BudgetRow], int]:
        """A page of budgets and their total."""
        return await self._list(ent.BUDGETS, {}, page, size)

    async def budget_references(self, budget_id: str) -> list[tuple[str, str]]:
        """``(kind, id)`` of every key, team, user and end user naming the budget."""
        return await self._threads.run("find budget users", ent.referencing, self._engine,
                                       budget_id)

    # ----------------------------------------------------------------- team members

    async def team_members(self, team_ids: Sequence[str]) -> dict[str, list[TeamMember]]:
        """Each team's members (``[]`` for a team without any)."""
        return await self._threads.run("list team members", ent.members_of, self._engine,
                                       list(dict.fromkeys(team_ids)))

    async def memberships(self, user_id: str) -> list[TeamMember]:
        """The teams a user belongs to, with the user's role in each."""
        return await self._threads.run("list memberships", ent.memberships_of, self._engine,
                                       user_id)

    async def team_memberships(self, pairs: Sequence[tuple[str, str]]) -> list[TeamMember]:
        """The memberships of those (team id, user id) pairs that exist."""
        if not pairs:
            return []
        return await self._threads.run("look up memberships", ent.members_by_pair,
                                       self._engine, list(pairs))

    async def change_team_members(
        self, team_id: str, *, add: Sequence[tuple[str, str, str | None]] = (),
        remove: Sequence[str] = (), roles: dict[str, str] | None = None,
        create_users: Sequence[str] = (), add_limits: dict[str, Any] | None = None,
        limits: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """In one transaction: create ``create_users`` (plain users), add members
        ``(user_id, role, email)`` (each with ``add_limits``), set ``roles`` and
        ``limits`` (``max_budget_nanousd``, ``tpm_limit``, ``rpm_limit`` per user id),
        remove members.

        Raises:
            StoreConflict: an added member is already in the team (nothing written).
        """
        now = self._now_ms()
        members = [TeamMember(team_id=team_id, user_id=u, role=r, user_email=e,
                              created_at_ms=now, **(add_limits or {})) for u, r, e in add]
        emails = {u: e for u, _, e in add}
        users = [ent.create_values(ent.USERS, {"user_id": u, "user_email": emails.get(u),
                                               "user_role": "internal_user"}, now_ms=now)
                 for u in create_users]
        await self._threads.run(
            "change team members",
            lambda: ent.change_members(self._engine, team_id, add=members, remove=remove,
                                       roles=roles, create_users=users, limits=limits),
        )

    # ------------------------------------------------------------------- spend logs

    async def insert_spend_logs(self, rows: Sequence[SpendLogRow]) -> int:
        """Insert rows in one transaction, skipping request ids already present.

        Returns:
            How many rows were new: writing the same batch twice is harmless.
        """
        if not rows:
            return 0
        return await self._threads.run(
            "insert spend logs", spend.insert_spend_logs, self._engine, list(rows)
        )

    async def query_spend_logs(
        self, *, page: int = 1, size: int = 100, **filters: Any
    ) -> tuple[list[SpendLogRow], int]:
        """A page of spend logs, newest first, and the total matching the filters.

        Args:
            filters: any :class:`~.queries_spend.SpendFilter` field (key_hash, team_id,
                user_id, end_user, tag, start_ms inclusive, end_ms exclusive).
        """
        ent.check_page(page, size)
        f = spend.SpendFilter(**filters)
        return await self._threads.run(
            "query spend logs",
            lambda: spend.query_spend_logs(self._engine, f, page=page, size=size),
        )

    async def spend_totals(self, **filters: Any) -> SpendTotals:
        """Requests, tokens and cost (nano-USD) over the matching spend logs."""
        f = spend.SpendFilter(**filters)
        return await self._threads.run("sum spend", spend.spend_totals, self._engine, f)

    async def spend_breakdown(self, *, columns: Sequence[spend.GroupBy], by_day: bool,
                              **filters: Any) -> list[dict[str, Any]]:
        """Sums per distinct (day,) key hash / team / user / end user / model group."""
        f = spend.SpendFilter(**filters)
        return await self._threads.run(
            "spend breakdown",
            lambda: spend.spend_breakdown(self._engine, f, columns=columns, by_day=by_day))

    async def daily_spend(self, *, group_by: spend.GroupBy, **filters: Any) -> list[DailySpend]:
        """Sums per UTC day and per key hash / team / user / end user / model group."""
        f = spend.SpendFilter(**filters)
        return await self._threads.run(
            "daily spend", lambda: spend.daily_spend(self._engine, f, group_by=group_by)
        )

    async def top_spend(self, *, column: spend.GroupBy, limit: int | None = None,
                        skip_empty: bool = False, **filters: Any) -> list[dict[str, Any]]:
        """Sums per key hash / team / ... / upstream model / deployment, largest first."""
        f = spend.SpendFilter(**filters)
        return await self._threads.run(
            "top spend",
            lambda: spend.top_spend(self._engine, f, column=column, limit=limit,
                                    skip_empty=skip_empty))

    async def tag_spend(self, *, tags: Sequence[str] | None = None, **filters: Any
                        ) -> list[dict[str, Any]]:
        """Sums per request tag (``tags``: only those), largest first."""
        f = spend.SpendFilter(**filters)
        chosen = None if tags is None else list(tags)
        return await self._threads.run(
            "spend per tag", lambda: spend.tag_spend(self._engine, f, tags=chosen))
