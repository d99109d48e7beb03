"""Create, read, update, delete and list keys, teams, users, end users and tags.

One table-driven implementation for the five entities: an :class:`Entity` names the
table, its id column, its row record and which fields callers may set. The functions
here block; :class:`~triogate.store.queries.Store` runs them in worker threads.

Callers pass the record's field names (``expires_at_ms``, ``budget_duration``); the
mapping to LiteLLM's column names (``expires_at``) lives here and nowhere else. An
unknown field name is a ``TypeError`` that lists the accepted ones, so a typo in an
admin handler fails loudly instead of being ignored.

Budget periods count from ``budget_anchor_s``: creation time, reset whenever an update
changes ``budget_duration`` (unless the update sets the anchor itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import attrs
import sqlalchemy as sa

from . import schema
from .records import (
    BudgetRow,
    EndUserRow,
    KeyRow,
    TagRow,
    TeamMember,
    TeamRow,
    UserRow,
    parse_duration,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sqlalchemy.engine import Connection, Engine

#: Record field ↔ column, where LiteLLM's column name lacks the unit.
_FIELD_TO_COLUMN = {
    "created_at_ms": "created_at",
    "updated_at_ms": "updated_at",
    "expires_at_ms": "expires_at",
    "previous_secret_expires_at_ms": "previous_secret_expires_at",
    "key_rotation_at_ms": "key_rotation_at",
    "last_rotation_at_ms": "last_rotation_at",
}
_COLUMN_TO_FIELD = {v: k for k, v in _FIELD_TO_COLUMN.items()}
_LIST_COLUMNS = frozenset({"models", "tags"})
_DICT_COLUMNS = frozenset({"metadata", "model_rpm_limit", "model_tpm_limit", "aliases",
                           "model_aliases", "model_max_budget"})
#: Fields no caller sets: derived (duration seconds, hint) or maintained (times).
_DERIVED = frozenset({"budget_duration_s", "created_at_ms", "updated_at_ms", "key_hint"})
#: Key fields only a rotation sets (``rotate_key``), never an update.
_ROTATION = frozenset({"secret_hash", "previous_secret_hash", "previous_secret_expires_at_ms",
                       "last_rotation_at_ms", "rotation_count"})
#: Rows fetched per ``IN (...)`` (far below SQLite's 32,766 bound parameters).
_IN_CHUNK = 500
MAX_PAGE_SIZE = 1000


@final
@attrs.frozen(kw_only=True)
class Entity:
    """What the generic queries need to know about one entity table."""

    name: str
    table: sa.Table
    row_cls: type[Any]
    id_field: str
    list_filters: tuple[str, ...] = ()

    @property
    def id_column(self) -> sa.Column[Any]:
        return self.table.c[self.id_field]

    @property
    def settable(self) -> frozenset[str]:
        """Fields an update may set (the id and derived fields excluded)."""
        return (frozenset(attrs.fields_dict(self.row_cls)) - _DERIVED - _ROTATION
                - {self.id_field})


KEYS = Entity(
    name="key",
    table=schema.keys,
    row_cls=KeyRow,
    id_field="token_hash",
    list_filters=("team_id", "user_id", "key_alias"),
)
TEAMS = Entity(name="team", table=schema.teams, row_cls=TeamRow, id_field="team_id")
USERS = Entity(
    name="user",
    table=schema.users,
    row_cls=UserRow,
    id_field="user_id",
    list_filters=("user_email",),
)
END_USERS = Entity(name="end user", table=schema.end_users, row_cls=EndUserRow, id_field="user_id")
TAGS = Entity(name="tag", table=schema.tags, row_cls=TagRow, id_field="tag")
BUDGETS = Entity(name="budget", table=schema.budgets, row_cls=BudgetRow, id_field="budget_id")


# --------------------------------------------------------------------- team members


def members_of(engine: Engine, team_ids: Sequence[str]) -> dict[str, list[TeamMember]]:
    """Each team's members (oldest first); teams without members map to ``[]``."""
    out: dict[str, list[TeamMember]] = {t: [] for t in team_ids}
    c = schema.team_members.c
    with engine.connect() as conn:
        for start in range(0, len(team_ids), _IN_CHUNK):
            chunk = list(team_ids[start : start + _IN_CHUNK])
            stmt = (sa.select(schema.team_members).where(c.team_id.in_(chunk))
                    .order_by(c.created_at, c.user_id))
            for m in conn.execute(stmt).mappings():
                out[m["team_id"]].append(_member(m))
    return out


def memberships_of(engine: Engine, user_id: str) -> list[TeamMember]:
    """The teams a user is in."""
    c = schema.team_members.c
    stmt = sa.select(schema.team_members).where(c.user_id == user_id).order_by(c.team_id)
    with engine.connect() as conn:
        return [_member(m) for m in conn.execute(stmt).mappings()]


def _member(m: Mapping[Any, Any]) -> TeamMember:
    return TeamMember(team_id=m["team_id"], user_id=m["user_id"], role=m["role"],
                      user_email=m["user_email"], created_at_ms=m["created_at"],
                      max_budget_nanousd=m.get("max_budget_nanousd"),
                      tpm_limit=m.get("tpm_limit"), rpm_limit=m.get("rpm_limit"))


#: A member's limits: the settable columns of ``team_members`` besides its role.
MEMBER_LIMITS = ("max_budget_nanousd", "tpm_limit", "rpm_limit")


def members_by_pair(engine: Engine, pairs: Sequence[tuple[str, str]]) -> list[TeamMember]:
    """The memberships of the (team, user) pairs that exist."""
    c = schema.team_members.c
    out: list[TeamMember] = []
    unique = list(dict.fromkeys(pairs))
    with engine.connect() as conn:
        for start in range(0, len(unique), _IN_CHUNK):
            chunk = unique[start : start + _IN_CHUNK]
            stmt = sa.select(schema.team_members).where(sa.or_(
                *(sa.and_(c.team_id == t, c.user_id == u) for t, u in chunk)))
            out += [_member(m) for m in conn.execute(stmt).mappings()]
    return out


def change_members(
    engine: Engine, team_id: str, *, add: Sequence[TeamMember] = (),
    remove: Sequence[str] = (), roles: Mapping[str, str] | None = None,
    create_users: Sequence[Mapping[str, Any]] = (),
    limits: Mapping[str, Mapping[str, Any]] | None = None,
    new_users_only: bool = False,
) -> None:
    """In one transaction: create missing users, add members, set roles and limits
    (``MEMBER_LIMITS`` columns per user id), remove members.

    An added member that already exists raises ``IntegrityError`` (nothing is written).
    A user to create that exists by then (created meanwhile) is kept as it is, unless
    ``new_users_only``: then it raises ``IntegrityError`` too (``/user/new``'s id taken).
    """
    c = schema.team_members.c
    with engine.begin() as conn:
        _add_members(conn, team_id, add, create_users, keep_existing=not new_users_only)
        for user_id, role in (roles or {}).items():
            conn.execute(sa.update(schema.team_members)
                         .where(c.team_id == team_id, c.user_id == user_id)
                         .values(role=role))
        for user_id, values in (limits or {}).items():
            conn.execute(sa.update(schema.team_members)
                         .where(c.team_id == team_id, c.user_id == user_id)
                         .values(**{k: values[k] for k in MEMBER_LIMITS if k in values}))
        if remove:
            conn.execute(sa.delete(schema.team_members)
                         .where(c.team_id == team_id, c.user_id.in_(list(remove))))


def create_team(engine: Engine, values: Mapping[str, Any], *,
                add: Sequence[TeamMember] = (),
                create_users: Sequence[Mapping[str, Any]] = ()) -> TeamRow:
    """In one transaction: insert a team, create missing users, add members; return the
    team. Nothing is written if any of it fails (``IntegrityError``: the team exists, or a
    member is named twice)."""
    with engine.begin() as conn:
        stmt = sa.insert(TEAMS.table).values(dict(values)).returning(*TEAMS.table.c)
        row: TeamRow = row_from_db(TEAMS, conn.execute(stmt).mappings().one())
        _add_members(conn, row.team_id, add, create_users)
    return row


def _add_members(conn: Connection, team_id: str, add: Sequence[TeamMember],
                 create_users: Sequence[Mapping[str, Any]], *,
                 keep_existing: bool = True) -> None:
    """Create the users that do not exist yet (one created meanwhile by a concurrent
    call is kept, no conflict, if ``keep_existing``), then add the members."""
    if create_users:
        insert: Any = sa.insert
        if not keep_existing:
            pass
        elif conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif conn.dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        stmt = insert(schema.users)
        if insert is not sa.insert:
            stmt = stmt.on_conflict_do_nothing(index_elements=[schema.users.c.user_id])
        conn.execute(stmt, [dict(u) for u in create_users])
    if add:
        conn.execute(sa.insert(schema.team_members), [
            {"team_id": team_id, "user_id": m.user_id, "role": m.role,
             "user_email": m.user_email, "created_at": m.created_at_ms,
             **{name: getattr(m, name) for name in MEMBER_LIMITS}} for m in add])


def referencing(engine: Engine, budget_id: str) -> list[tuple[str, str]]:
    """``(kind, id)`` of every key, team, user and end user naming ``budget_id``."""
    out: list[tuple[str, str]] = []
    with engine.connect() as conn:
        for kind, entity in (("key", KEYS), ("team", TEAMS), ("user", USERS),
                             ("end_user", END_USERS)):
            stmt = sa.select(entity.id_column).where(entity.table.c.budget_id == budget_id)
            out += [(kind, ident) for ident in conn.execute(stmt).scalars()]
    return out


def row_from_db(entity: Entity, mapping: Mapping[Any, Any]) -> Any:
    """The entity's record from a result mapping (JSON lists become tuples)."""
    values: dict[str, Any] = {}
    for column, value in mapping.items():
        if column in _LIST_COLUMNS:
            value = tuple(value or ())
        elif column in _DICT_COLUMNS:
            value = dict(value or {})
        elif column == "blocked":
            value = bool(value)
        values[_COLUMN_TO_FIELD.get(column, column)] = value
    return entity.row_cls(**values)


# --------------------------------------------------------------------- key secrets


def keys_by_secret(engine: Engine, hashes: Sequence[str], now_ms: int
                   ) -> dict[str, tuple[KeyRow, int | None]]:
    """The key each secret hash authenticates as, with the time the secret stops working
    (a previous secret in its grace period) or None (the current secret)."""
    c = schema.keys.c
    out: dict[str, tuple[KeyRow, int | None]] = {}
    unique = list(dict.fromkeys(hashes))
    with engine.connect() as conn:
        for start in range(0, len(unique), _IN_CHUNK):
            chunk = unique[start : start + _IN_CHUNK]
            stmt = sa.select(schema.keys).where(sa.or_(
                sa.and_(c.token_hash.in_(chunk), c.secret_hash.is_(None)),
                c.secret_hash.in_(chunk),
                sa.and_(c.previous_secret_hash.in_(chunk),
                        c.previous_secret_expires_at > now_ms)))
            for mapping in conn.execute(stmt).mappings():
                row: KeyRow = row_from_db(KEYS, mapping)
                if row.current_secret_hash in chunk:
                    out[row.current_secret_hash] = (row, None)
                if row.previous_secret_hash in chunk:
                    out.setdefault(row.previous_secret_hash,
                                   (row, row.previous_secret_expires_at_ms))
    return out


def rotate_key(engine: Engine, token_hash: str, new_secret_hash: str, key_hint: str, *,
               grace_ms: int, now_ms: int, next_rotation_at_ms: int | None,
               due_at_ms: int | None = None) -> tuple[KeyRow, str] | None:
    """Give key ``token_hash`` a new secret; the old one is accepted ``grace_ms`` more
    (0: refused at once). Returns the new row and the old secret's hash, or None when
    there is no such key (or, with ``due_at_ms``, when another process rotated it
    first: its ``key_rotation_at`` is no longer ``due_at_ms``)."""
    c = schema.keys.c
    with engine.begin() as conn:
        where = [c.token_hash == token_hash]
        if due_at_ms is not None:
            where.append(c.key_rotation_at == due_at_ms)
        current = conn.execute(sa.select(schema.keys).where(*where)).mappings().one_or_none()
        if current is None:
            return None
        old: KeyRow = row_from_db(KEYS, current)
        old_secret = old.current_secret_hash
        values: dict[str, Any] = {
            "secret_hash": new_secret_hash,
            "previous_secret_hash": old_secret if grace_ms > 0 else None,
            "previous_secret_expires_at": now_ms + grace_ms if grace_ms > 0 else None,
            "key_hint": key_hint,
            "last_rotation_at": now_ms,
            "rotation_count": (old.rotation_count or 0) + 1,
            "key_rotation_at": next_rotation_at_ms,
            "updated_at": now_ms,
        }
        # The secret read above must still be the current one (two rotations at once:
        # one wins, the other changes nothing).
        stmt = (sa.update(schema.keys)
                .where(*where, sa.func.coalesce(c.secret_hash, c.token_hash) == old_secret)
                .values(values).returning(*schema.keys.c))
        mapping = conn.execute(stmt).mappings().one_or_none()
    return None if mapping is None else (row_from_db(KEYS, mapping), old_secret)


def keys_due_for_rotation(engine: Engine, now_ms: int, limit: int) -> list[KeyRow]:
    """Keys with ``auto_rotate`` whose next rotation is due, earliest first."""
    c = schema.keys.c
    stmt = (sa.select(schema.keys)
            .where(c.auto_rotate.is_(True), c.key_rotation_at <= now_ms)
            .order_by(c.key_rotation_at).limit(limit))
    with engine.connect() as conn:
        return [row_from_db(KEYS, m) for m in conn.execute(stmt).mappings()]


def check_fields(entity: Entity, fields: Mapping[str, Any], *, allowed: frozenset[str]) -> None:
    """Raise ``TypeError`` naming any field the entity has no settable column for."""
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise TypeError(f"unknown {entity.name} field(s) {unknown}; accepted: {sorted(allowed)}")


def to_columns(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Column values for record fields: units mapped, lists and dicts validated."""
    values: dict[str, Any] = {}
    for name, value in fields.items():
        column = _FIELD_TO_COLUMN.get(name, name)
        if column in _LIST_COLUMNS:
            if isinstance(value, (str, bytes)):
                raise TypeError(f"{name} must be a list of strings, not a string")
            value = [str(v) for v in (value or ())]
        elif column in _DICT_COLUMNS:
            value = dict(value or {})
        elif column == "blocked":
            value = bool(value)
        elif column == "budget_duration":
            values["budget_duration_s"] = None if value is None else parse_duration(value)
        values[column] = value
    return values


def create_values(entity: Entity, fields: Mapping[str, Any], *, now_ms: int) -> dict[str, Any]:
    """Every column of a new row: the given fields plus defaults and times."""
    values: dict[str, Any] = {
        c.name: ([] if c.name in _LIST_COLUMNS else {} if c.name in _DICT_COLUMNS else None)
        for c in entity.table.c
    }
    if "blocked" in values:
        values["blocked"] = False
    values.update(to_columns(fields))
    if values.get("budget_anchor_s") is None and "budget_anchor_s" in values:
        values["budget_anchor_s"] = now_ms // 1000
    values["created_at"] = values["updated_at"] = now_ms
    return values


def create(engine: Engine, entity: Entity, values: Mapping[str, Any]) -> Any:
    """Insert one row; return its record (``IntegrityError`` if the id exists)."""
    with engine.begin() as conn:
        stmt = sa.insert(entity.table).values(dict(values)).returning(*entity.table.c)
        return row_from_db(entity, conn.execute(stmt).mappings().one())


def get_many(engine: Engine, entity: Entity, ids: Sequence[str]) -> dict[str, Any]:
    """Records by id; ids not found are absent from the result."""
    unique = list(dict.fromkeys(ids))
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        for start in range(0, len(unique), _IN_CHUNK):
            chunk = unique[start : start + _IN_CHUNK]
            stmt = sa.select(entity.table).where(entity.id_column.in_(chunk))
            for mapping in conn.execute(stmt).mappings():
                out[mapping[entity.id_field]] = row_from_db(entity, mapping)
    return out


def update(
    engine: Engine, entity: Entity, id_: str, fields: Mapping[str, Any], *, now_ms: int
) -> Any:
    """Set the given fields of one row; return the new record, or None if there is none."""
    table = entity.table
    values: dict[str, Any] = to_columns(fields)
    values["updated_at"] = now_ms
    if "budget_duration" in values and "budget_anchor_s" not in values:
        # SET expressions see the old row: the anchor moves only if the duration changes.
        values["budget_anchor_s"] = sa.case(
            (table.c.budget_duration.is_distinct_from(values["budget_duration"]), now_ms // 1000),
            else_=table.c.budget_anchor_s,
        )
    stmt = sa.update(table).where(entity.id_column == id_).values(values).returning(*table.c)
    with engine.begin() as conn:
        mapping = conn.execute(stmt).mappings().one_or_none()
    return None if mapping is None else row_from_db(entity, mapping)


def delete_many(engine: Engine, entity: Entity, ids: Sequence[str]) -> int:
    """Delete rows by id; return how many existed."""
    unique = list(dict.fromkeys(ids))
    deleted = 0
    with engine.begin() as conn:
        for start in range(0, len(unique), _IN_CHUNK):
            chunk = unique[start : start + _IN_CHUNK]
            result = conn.execute(sa.delete(entity.table).where(entity.id_column.in_(chunk)))
            deleted += result.rowcount
    return deleted


def list_page(
    engine: Engine, entity: Entity, filters: Mapping[str, Any], *, page: int, size: int
) -> tuple[list[Any], int]:
    """One page (oldest first, then by id: a stable order) and the number of matches."""
    table = entity.table
    where = [table.c[name] == value for name, value in filters.items() if value is not None]
    with engine.connect() as conn:
        total = conn.execute(
            sa.select(sa.func.count()).select_from(table).where(*where)
        ).scalar_one()
        result = conn.execute(
            sa.select(table)
            .where(*where)
            .order_by(table.c.created_at, entity.id_column)
            .limit(size)
            .offset((page - 1) * size)
        )
        return [row_from_db(entity, m) for m in result.mappings()], int(total)


def check_page(page: int, size: int) -> None:
    """Raise ``ValueError`` unless ``page >= 1`` and ``1 <= size <= MAX_PAGE_SIZE``."""
    if page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
        raise ValueError(f"page must be >= 1 and size in 1..{MAX_PAGE_SIZE} ({page=}, {size=})")
