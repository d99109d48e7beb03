"""Who may call which admin route: LiteLLM's roles, in ONE table (:data:`RULES`).

The caller of an admin route is one of:

* ``proxy_admin``: the master key, or a key of a user with that role. Everything.
* ``proxy_admin_viewer``: reads everything, writes nothing.
* ``internal_user``: reads and writes its own keys (``user_id`` = itself), within its
  own ``models`` and ``max_budget``; reads itself, its teams and its spend.
* ``internal_user_viewer``: reads its own keys, itself, its teams and its spend.
* ``key``: a key whose user has no role (or that has no user): reads itself
  (``/key/info`` without ``key``), its team and its own spend.

A user created by ``/user/new`` without ``user_role`` is an ``internal_user``
(LiteLLM's default). **Team admins** (``members_with_roles`` role ``admin``) also manage
their team's members and keys, whatever their role; the table names them ``team_admin``.

:data:`RULES` gives each route the roles that may call it at all (401/403 otherwise,
before the body is read); handlers then narrow by ownership with the :class:`Caller`
methods (``may_read_key`` ...). ``docs/governance.md`` renders the same table.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, final

import attrs

from triogate.api.admin.common import sql, store_of
from triogate.api.errors import ApiError
from triogate.store.records import hash_key

if TYPE_CHECKING:
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.store import KeyRow, UserRow

ADMIN = "proxy_admin"
VIEWER = "proxy_admin_viewer"
INTERNAL = "internal_user"
INTERNAL_VIEWER = "internal_user_viewer"
KEY = "key"
TEAM_ADMIN = "team_admin"
ROLES = (ADMIN, VIEWER, INTERNAL, INTERNAL_VIEWER, KEY)


@final
@attrs.frozen(kw_only=True)
class Rule:
    """Who may call a route, and what they then see or change (for the docs)."""

    roles: frozenset[str]
    scope: str


def _rule(scope: str, *roles: str) -> Rule:
    return Rule(roles=frozenset(roles), scope=scope)


_ADMIN_ONLY = _rule("proxy admins only", ADMIN)
_ADMIN_READ = _rule("admins and viewers: every row", ADMIN, VIEWER)
_KEY_WRITE = _rule("admins: any key; internal users: their own keys (within their models "
                   "and budget); team admins: their teams' keys", ADMIN, INTERNAL, TEAM_ADMIN)
_EVERYONE = (ADMIN, VIEWER, INTERNAL, INTERNAL_VIEWER, KEY, TEAM_ADMIN)

#: (method, path) → rule. The admin route table (``routes.py``) is built from this.
RULES: dict[tuple[str, str], Rule] = {
    ("POST", "/key/generate"): _KEY_WRITE,
    ("POST", "/key/update"): _KEY_WRITE,
    ("POST", "/key/delete"): _KEY_WRITE,
    ("POST", "/key/block"): _KEY_WRITE,
    ("POST", "/key/unblock"): _KEY_WRITE,
    ("POST", "/key/regenerate"): _KEY_WRITE,
    ("GET", "/key/info"): _rule("admins and viewers: any key; others: keys they own, their "
                                "teams' keys (team admins), a key itself", *_EVERYONE),
    ("GET", "/key/list"): _rule("admins and viewers: every key; users: their own keys and "
                                "their teams' keys (team admins)",
                                ADMIN, VIEWER, INTERNAL, INTERNAL_VIEWER, TEAM_ADMIN),
    ("GET", "/team/info"): _rule("admins and viewers: any team; others: teams they belong "
                                 "to (a key: its own team)", *_EVERYONE),
    ("GET", "/team/list"): _rule("admins and viewers: every team; users: their teams",
                                 ADMIN, VIEWER, INTERNAL, INTERNAL_VIEWER, TEAM_ADMIN),
    ("POST", "/team/member_add"): _rule("proxy admins; team admins for their team",
                                        ADMIN, TEAM_ADMIN),
    ("POST", "/team/member_delete"): _rule("proxy admins; team admins for their team",
                                           ADMIN, TEAM_ADMIN),
    ("POST", "/team/member_update"): _rule("proxy admins; team admins for their team",
                                           ADMIN, TEAM_ADMIN),
    ("GET", "/user/info"): _rule("admins and viewers: any user; users: themselves",
                                 ADMIN, VIEWER, INTERNAL, INTERNAL_VIEWER, TEAM_ADMIN),
    ("GET", "/user/list"): _ADMIN_READ,
    ("GET", "/spend/logs"): _rule("admins and viewers: every row; users: their own "
                                  "requests; a key: its own requests", *_EVERYONE),
    ("GET", "/spend/logs/ui"): _rule("as /spend/logs", *_EVERYONE),
    ("GET", "/spend/logs/v2"): _rule("as /spend/logs", *_EVERYONE),
    ("GET", "/spend/daily"): _ADMIN_READ,
    ("GET", "/global/spend/report"): _ADMIN_READ,
    **{("GET", f"/global/spend{tail}"): _ADMIN_READ
       for tail in ("", "/logs", "/keys", "/models", "/teams", "/end_users", "/tags",
                    "/provider")},
    ("POST", "/global/spend/end_users"): _ADMIN_READ,
    ("GET", "/spend/tags"): _ADMIN_READ,
    ("POST", "/tag/info"): _ADMIN_READ,
    # LiteLLM: any key (its holder needs the names to ask for a guardrail); no secrets.
    ("GET", "/guardrails/list"): _rule("any key: the config's guardrails (names, modes, "
                                       "default_on; no secrets)", *_EVERYONE),
    ("GET", "/v2/guardrails/list"): _rule("as /guardrails/list", *_EVERYONE),
}
#: The writes and reads of each entity that have no rule above (admins write, admins
#: and viewers read).
_SERVED = {
    "/team": ("new", "update", "delete", "block", "unblock"),
    "/user": ("new", "update", "delete"),
    "/customer": ("new", "update", "delete", "block", "unblock", "info", "list"),
    "/end_user": ("new", "update", "delete", "block", "unblock", "info", "list"),
    "/tag": ("new", "update", "delete", "info", "list"),
    "/budget": ("new", "update", "delete", "list"),
}
for _prefix, _verbs in _SERVED.items():
    for _verb in _verbs:
        _method = "GET" if _verb in ("info", "list") else "POST"
        RULES[(_method, f"{_prefix}/{_verb}")] = (
            _ADMIN_READ if _method == "GET" else _ADMIN_ONLY)
RULES[("POST", "/budget/info")] = _ADMIN_READ

#: ``GET /health`` (not an admin route, but LiteLLM's rule: proxy admins only).
HEALTH_RULE = _rule("calls every deployment", ADMIN)


@final
@attrs.frozen(kw_only=True)
class Caller:
    """Who called an admin route.

    Attributes:
        role: one of :data:`ROLES`.
        key_hash: the calling key's hash (None for the master key).
        user_id: the calling key's user, when it has one.
        team_id: the calling key's team.
        user: the user's row (its ``models`` and budget bound what it may give a key).
        admin_of: teams whose admin the user is.
        member_of: teams the user belongs to (any role).
    """

    role: str
    key_hash: str | None = None
    user_id: str | None = None
    team_id: str | None = None
    user: UserRow | None = None
    admin_of: frozenset[str] = frozenset()
    member_of: frozenset[str] = frozenset()

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN

    @property
    def sees_all(self) -> bool:
        return self.role in (ADMIN, VIEWER)

    def may_read_key(self, row: KeyRow) -> bool:
        return (self.sees_all or row.token_hash == self.key_hash
                or (self.user_id is not None and row.user_id == self.user_id
                    and self.role in (INTERNAL, INTERNAL_VIEWER))
                or (row.team_id is not None and row.team_id in self.admin_of))

    def may_write_key(self, row: KeyRow) -> bool:
        return (self.is_admin
                or (self.role == INTERNAL and self.user_id is not None
                    and row.user_id == self.user_id)
                or (row.team_id is not None and row.team_id in self.admin_of))

    def may_read_team(self, team_id: str) -> bool:
        return self.sees_all or team_id in self.member_of or team_id == self.team_id

    def may_manage_team(self, team_id: str) -> bool:
        return self.is_admin or team_id in self.admin_of

    def may_read_user(self, user_id: str) -> bool:
        return self.sees_all or user_id == self.user_id


MASTER = Caller(role=ADMIN)


def forbidden(what: str) -> ApiError:
    """403 for a caller whose role does not cover ``what``."""
    return ApiError(403, f"your key may not {what}", "permission_error")


async def authorize(services: Services, request: Request, rule: Rule) -> Caller:
    """The caller, if ``rule`` lets its role call the route at all. A checkpoint.

    Raises:
        ApiError: 401 without a key or with an unknown, blocked or expired one; 403 when
            the caller's role may not call the route.
    """
    caller = await resolve_caller(services, request)
    allowed = caller.role in rule.roles or (TEAM_ADMIN in rule.roles and caller.admin_of)
    if not allowed:
        if rule.roles == {ADMIN}:
            raise ApiError(403, "this route needs the master key or a proxy_admin user's key",
                           "permission_error")
        raise forbidden(f"call this route (role {caller.role}; allowed: "
                        f"{', '.join(sorted(rule.roles))})")
    return caller


async def resolve_caller(services: Services, request: Request) -> Caller:
    """Master key → proxy admin; a virtual key → its user's role (SQL: admin routes are
    off the hot path). A checkpoint."""
    master = services.config.master_key
    raw = request.bearer()
    if master is None:
        return MASTER  # an open gateway (warned at start-up)
    if raw is None:
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'",
                       "authentication_error")
    if hmac.compare_digest(raw.encode(), master.encode()):
        return MASTER
    if services.store is None:
        raise ApiError(401, "invalid API key", "authentication_error")
    store = store_of(services)
    with sql("look up the calling key"):
        key, ends_ms = (await store.keys_by_secret([hash_key(raw)])).get(
            hash_key(raw), (None, None))
    if key is None:
        raise ApiError(401, "invalid API key", "authentication_error")
    if key.blocked:
        raise ApiError(401, "this API key is blocked", "authentication_error")
    now_ms = services.clock_ms()
    if any(t is not None and t <= now_ms for t in (key.expires_at_ms, ends_ms)):
        raise ApiError(401, "this API key has expired", "authentication_error")
    user: UserRow | None = None
    admin_of: set[str] = set()
    member_of: set[str] = set()
    if key.user_id is not None:
        with sql("look up the calling user"):
            user = (await store.get_users([key.user_id])).get(key.user_id)
            memberships = await store.memberships(key.user_id) if user else []
        for m in memberships:
            member_of.add(m.team_id)
            if m.role == "admin":
                admin_of.add(m.team_id)
    role = KEY if user is None else (user.user_role or INTERNAL)
    if user is not None and user.blocked:
        raise ApiError(403, f"user '{user.user_id}' is blocked", "permission_error")
    return Caller(role=role, key_hash=key.token_hash, user_id=key.user_id,
                  team_id=key.team_id, user=user, admin_of=frozenset(admin_of),
                  member_of=frozenset(member_of))
