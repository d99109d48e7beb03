"""``/team/*``, ``/user/*``, ``/customer/*`` (end users) and ``/tag/*``: one table-driven
implementation, since the four differ only in names, fields and the shape of ``info``.

An :class:`EntityApi` names the entity as the API spells it (``team_id``, ``end_user_id``,
``name``) and as the store does (``create_team``, ``get_end_users``). Every change is
announced so it takes effect on every process within a second; creations too, because an
end user or a tag may be remembered as unknown, and a recreated team or a new user may
complete key bundles cached without them.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, final

import attrs

from triogate.api.admin.bounds import bad
from triogate.api.admin.budgets import inherit
from triogate.api.admin.common import (
    announce,
    begin,
    budget_states,
    context,
    not_found,
    sql,
    store_of,
)
from triogate.api.admin.fields import (
    END_USER_FIELDS,
    KEY_FIELDS,
    TAG_FIELDS,
    TEAM_FIELDS,
    USER_FIELDS,
    only,
    page_count,
    paging,
    parse_fields,
    render_budget,
    render_member,
    render_row,
    required_str,
    str_list,
)
from triogate.api.admin.guardrail_fields import configured, fold
from triogate.api.admin.keys import require_team
from triogate.api.admin.members import member_ids, parse_members
from triogate.api.admin.roles import forbidden
from triogate.api.errors import ApiError
from triogate.api.http import Response
from triogate.governance.from_rows import (
    end_user_principal,
    tag_principal,
    team_principal,
    user_principal,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from triogate.api.admin.converters import Converter
    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.governance.principals import Principal
    from triogate.store import Store


@final
@attrs.frozen(kw_only=True)
class EntityApi:
    """One entity's names in the API and in the store.

    Attributes:
        kind: the principal / identity kind (``announce`` and budgets).
        label: how messages name it.
        noun, plural: the store's method suffixes (``create_<noun>``, ``get_<plural>``).
        id_param: the body field holding the id (update, block, create).
        store_id: the store's keyword (and the row's attribute) for the id.
        info_param: the query parameter of ``info``.
        delete_param: the body list of ``delete``.
        fields: settable body fields.
        id_required: whether ``new`` needs the id (teams and users get a UUID).
        principal: row → principal, for budget reads.
        info_key: LiteLLM nests info under this key (``team_info``); None = flat.
        keys_filter: ``list_keys`` filter whose keys ``info`` lists (None = no keys).
        list_key: LiteLLM wraps lists under this key with paging (None = a bare array).
        block_creates: ``block`` creates missing rows (LiteLLM's end users) instead of 404.
    """

    kind: str
    label: str
    noun: str
    plural: str
    id_param: str
    store_id: str
    info_param: str
    delete_param: str
    fields: Mapping[str, Converter]
    id_required: bool
    principal: Callable[[Any], Principal]
    info_key: str | None = None
    keys_filter: str | None = None
    list_key: str | None = None
    block_creates: bool = False

    def store_call(self, store: Store, verb: str) -> Callable[..., Any]:
        noun = self.plural if verb in ("get", "delete", "list") else self.noun
        return getattr(store, f"{verb}_{noun}")  # type: ignore[no-any-return]


TEAMS = EntityApi(
    kind="team", label="team", noun="team", plural="teams", id_param="team_id",
    store_id="team_id", info_param="team_id", delete_param="team_ids", fields=TEAM_FIELDS,
    id_required=False, principal=team_principal, info_key="team_info", keys_filter="team_id",
)
USERS = EntityApi(
    kind="user", label="user", noun="user", plural="users", id_param="user_id",
    store_id="user_id", info_param="user_id", delete_param="user_ids", fields=USER_FIELDS,
    id_required=False, principal=user_principal, info_key="user_info", keys_filter="user_id",
    list_key="users",
)
END_USERS = EntityApi(
    kind="end_user", label="end user", noun="end_user", plural="end_users",
    id_param="user_id", store_id="user_id", info_param="end_user_id",
    delete_param="user_ids", fields=END_USER_FIELDS, id_required=True,
    principal=end_user_principal, block_creates=True,
)
TAGS = EntityApi(
    kind="tag", label="tag", noun="tag", plural="tags", id_param="name", store_id="tag",
    info_param="name", delete_param="names", fields=TAG_FIELDS, id_required=True,
    principal=tag_principal,
)

#: /user/new fields that describe the key it creates, not the user.
_USER_KEY_FIELDS = frozenset({"key_alias", "duration", "aliases"})


def shaped(api: EntityApi, details: dict[str, Any]) -> dict[str, Any]:
    """A rendered row as LiteLLM answers for it: an end user nests its limits in
    ``litellm_budget_table`` too."""
    if api.kind == "end_user":
        details["litellm_budget_table"] = {
            k: details.get(k) for k in ("budget_id", "max_budget", "budget_duration",
                                        "tpm_limit", "rpm_limit", "max_parallel_requests",
                                        "budget_reset_at")}
    return details


async def _create(api: EntityApi, services: Services, body: dict[str, Any],
                  extra: frozenset[str] = frozenset(), team_id: str | None = None,
                  **with_row: Any
                  ) -> tuple[Any, dict[str, str]]:
    fields = parse_fields(body, api.fields, context(services),
                          extra=extra | {api.id_param})
    ident = body.get(api.id_param)
    if ident is not None or api.id_required:
        fields[api.store_id] = ident = required_str(body, api.id_param)
    what = f"create {api.label} '{ident}'" if ident else f"create {api.label}"
    if api.kind == "team":  # /team/new is proxy admins' only (roles.RULES)
        fields = fold(fields, None, configured=configured(services), admin=True,
                      entity="team")
    if api.kind != "tag":
        fields = await inherit(store_of(services), fields)
    with sql(what):
        if team_id is not None:  # a user joining a team: one transaction
            row = await store_of(services).create_user_in_team(team_id, "user", **fields)
        else:
            row = await api.store_call(store_of(services), "create")(**fields, **with_row)
    headers = await announce(services, (api.kind, getattr(row, api.store_id)))
    return row, headers


async def new(api: EntityApi, services: Services, request: Request, caller: Caller
              ) -> Response:
    """POST /<entity>/new (a team may come with its ``members_with_roles``)."""
    body = await begin(services, request)
    members: list[Any] = []
    with_members: dict[str, Any] = {}
    if api.kind == "team" and body.get("members_with_roles"):
        body = dict(body)
        wanted = parse_members("members_with_roles", body.pop("members_with_roles"))
        parse_fields(body, api.fields, context(services), extra=frozenset({api.id_param}))
        members, create = await member_ids(store_of(services), wanted)
        # The team, its new users and its members: one transaction (all or nothing).
        with_members = {"members": members, "create_users": create}
    row, headers = await _create(api, services, body, **with_members)
    out = shaped(api, render_row(row))
    if api.kind == "team":
        out["members_with_roles"] = [{"user_id": u, "user_email": e, "role": r}
                                     for u, r, e in members]
    return Response.json(out, headers=headers)


async def user_new(services: Services, request: Request, caller: Caller) -> Response:
    """POST /user/new: the user and, unless ``auto_create_key`` is false, a key for it.

    ``key_alias``, ``duration`` and ``aliases`` describe that key; its raw value is in
    ``key``. With ``team_id`` the user joins that team (role ``user``) in the same
    transaction that creates it, and its key belongs to the team.
    """
    body = await begin(services, request)
    auto = body.get("auto_create_key", True)
    if not isinstance(auto, bool):
        raise bad("auto_create_key", "must be a boolean")
    key_body = {k: v for k, v in body.items() if k in _USER_KEY_FIELDS}
    key_fields = parse_fields(key_body, KEY_FIELDS, context(services))
    user_body = {k: v for k, v in body.items() if k not in _USER_KEY_FIELDS}
    if not auto and any(v not in (None, {}) for v in key_body.values()):
        raise bad(next(iter(key_body)), "describes the user's key: set auto_create_key")
    team_id = user_body.pop("team_id", None)
    if team_id is not None:
        team_id = required_str({"team_id": team_id}, "team_id")
        await require_team(store_of(services), team_id)
        key_fields["team_id"] = team_id
    if user_body.get("user_role") is None:
        user_body["user_role"] = "internal_user"  # LiteLLM's default for /user/new
    row, headers = await _create(USERS, services, user_body,
                                 extra=frozenset({"auto_create_key"}), team_id=team_id)
    out = render_row(row)
    out["teams"] = [team_id] if team_id else []
    if auto:
        with sql(f"create a key for user '{row.user_id}'"):
            raw, key = await store_of(services).create_key(user_id=row.user_id, **key_fields)
        rendered = render_row(key)
        out.update({name: rendered[name] for name in (
            "token", "key_name", "key_hint", "key_alias", "expires", "expires_at_ms",
            "aliases")})
        out["key"] = raw
    return Response.json(out, headers=headers)


async def _apply(api: EntityApi, services: Services, ident: str, fields: dict[str, Any]
                 ) -> tuple[Any, dict[str, str]]:
    with sql(f"update {api.label} '{ident}'"):
        row = await api.store_call(store_of(services), "update")(ident, **fields)
    if row is None:
        raise not_found(api.label, ident, api.id_param)
    return row, await announce(services, (api.kind, ident))


async def update(api: EntityApi, services: Services, request: Request, caller: Caller
                 ) -> Response:
    """POST /<entity>/update: the id plus the fields to change."""
    body = await begin(services, request)
    if api.kind == "user" and body.get("user_id") is None and body.get("user_email"):
        body = {**body, "user_id": await _user_by_email(services, body["user_email"])}
    ident = required_str(body, api.id_param)
    fields = parse_fields(body, api.fields, context(services), extra=frozenset({api.id_param}))
    if api.kind != "tag":
        store = store_of(services)
        with sql(f"look up {api.label} '{ident}'"):
            current = (await api.store_call(store, "get")([ident])).get(ident)
        if current is None and api.kind == "user":
            # LiteLLM's upsert: an unknown user is created, validated as /user/new.
            body = dict(body)
            body.setdefault("user_role", None)
            if body["user_role"] is None:
                body["user_role"] = "internal_user"
            row, headers = await _create(api, services, body)
            return Response.json(shaped(api, render_row(row)), headers=headers)
        if current is None:
            raise not_found(api.label, ident, api.id_param)
        if api.kind == "team":
            fields = fold(fields, current.metadata, configured=configured(services),
                          admin=caller.is_admin, entity="team")
        fields = await inherit(store, fields, current)
    row, headers = await _apply(api, services, ident, fields)
    return Response.json(shaped(api, render_row(row)), headers=headers)


async def _user_by_email(services: Services, email: Any) -> str:
    """The one user with ``email`` (LiteLLM's /user/update names a user either way)."""
    if not isinstance(email, str):
        raise bad("user_email", "must be a string")
    with sql("look up a user by e-mail"):
        rows, total = await store_of(services).list_users(user_email=email, page=1, size=2)
    if total != 1:
        raise ApiError(404 if total == 0 else 400,
                       f"{'no' if total == 0 else 'more than one'} user has user_email "
                       f"'{email[:256]}'; give user_id", "invalid_request_error"
                       if total else "not_found_error", param="user_email")
    return rows[0].user_id


def _ids(api: EntityApi, body: dict[str, Any]) -> list[str]:
    """``{"<delete_param>": [...]}`` or ``{"<id_param>": "..."}`` (LiteLLM uses both)."""
    only(body, api.id_param, api.delete_param)
    if api.delete_param in body:
        return list(dict.fromkeys(str_list(body, api.delete_param)))
    if api.id_param in body:
        return [required_str(body, api.id_param)]
    raise ApiError(400, f"missing required field '{api.delete_param}'", param=api.delete_param)


async def set_blocked(api: EntityApi, blocked: bool, services: Services, request: Request,
                      caller: Caller) -> Response:
    """POST /<entity>/block and /unblock: one id, or a list of them."""
    body = await begin(services, request)
    ids = _ids(api, body)
    store = store_of(services)
    with sql(f"look up {api.label}s"):
        found = await api.store_call(store, "get")(ids)
    missing = [i for i in ids if i not in found]
    if missing and not (api.block_creates and blocked):
        # All or nothing: no id is changed unless every one exists.
        raise ApiError(404, f"{api.label}(s) not found: {', '.join(map(repr, missing))}; "
                       "nothing was changed", "not_found_error", param=api.delete_param)
    if api.block_creates and blocked:
        # LiteLLM blocks end users it has never seen: create them blocked.
        for ident in ids:
            if ident not in found:
                with sql(f"create {api.label} '{ident}'"):
                    await api.store_call(store, "create")(**{api.store_id: ident,
                                                              "blocked": True})
    rows = []
    headers: dict[str, str] = {}
    for ident in ids:
        row, more = await _apply(api, services, ident, {"blocked": blocked})
        rows.append(render_row(row))
        headers.update(more)
    out = rows[0] if api.id_param in body else {api.delete_param: ids, "blocked": blocked}
    return Response.json(out, headers=headers)


async def delete(api: EntityApi, services: Services, request: Request, caller: Caller
                 ) -> Response:
    """POST /<entity>/delete: every id must exist, or nothing is deleted."""
    body = await begin(services, request)
    ids = _ids(api, body)
    store = store_of(services)
    with sql(f"look up {api.label}s"):
        found = await api.store_call(store, "get")(ids)
    missing = [i for i in ids if i not in found]
    if missing:
        raise ApiError(404, f"{api.label}(s) not found: {', '.join(map(repr, missing))}; "
                       "nothing was deleted", "not_found_error", param=api.delete_param)
    with sql(f"delete {api.label}s"):
        await api.store_call(store, "delete")(ids)
    headers = await announce(services, *((api.kind, i) for i in ids))
    return Response.json({"deleted": ids}, headers=headers)


async def _info_of(api: EntityApi, services: Services, ident: str
                   ) -> tuple[dict[str, Any], Any, dict[str, str]]:
    with sql(f"look up {api.label} '{ident}'"):
        row = (await api.store_call(store_of(services), "get")([ident])).get(ident)
    if row is None:
        raise not_found(api.label, ident, api.info_param)
    states, headers = await budget_states(services, [api.principal(row)])
    return {**render_row(row), **render_budget(states[0])}, row, headers


async def info(api: EntityApi, services: Services, request: Request, caller: Caller
               ) -> Response:
    """GET /<entity>/info?<info_param>=: the row, this period's spend, and (teams, users)
    its keys, in LiteLLM's shape. Without the id: the caller's own user (or key's team)."""
    ident = request.query.get(api.info_param) or (
        caller.user_id if api.kind == "user" else caller.team_id if api.kind == "team"
        else None)
    if not ident:
        raise ApiError(400, f"missing query parameter '{api.info_param}'",
                       param=api.info_param)
    if api.kind == "team" and not caller.may_read_team(ident):
        raise not_found(api.label, ident, api.info_param)
    if api.kind == "user" and not caller.may_read_user(ident):
        # LiteLLM's answer, whether or not the user exists.
        raise forbidden(f"read user '{ident}' (only your own user)")
    details, _, headers = await _info_of(api, services, ident)
    if api.info_key is None:
        return Response.json(shaped(api, details), headers=headers)
    out: dict[str, Any] = {api.id_param: ident, api.info_key: details}
    if api.keys_filter is not None:
        store = store_of(services)
        with sql(f"list the keys of {api.label} '{ident}'"):
            keys, _ = await store.list_keys(**{api.keys_filter: ident}, page=1, size=1000)
        out["keys"] = [render_row(k) for k in keys if caller.may_read_key(k)]
        if api.kind == "user":
            with sql(f"look up the teams of user '{ident}'"):
                memberships = await store.memberships(ident)
                team_ids = sorted({k.team_id for k in keys if k.team_id}
                                  | {m.team_id for m in memberships})
                teams = await store.get_teams(team_ids)
            out["teams"] = [render_row(t) for t in teams.values()]
        else:
            with sql(f"list the members of team '{ident}'"):
                members = (await store.team_members([ident]))[ident]
            details["members_with_roles"] = [render_member(m) for m in members]
            out["team_memberships"] = details["members_with_roles"]
    return Response.json(out, headers=headers)


async def tag_info_many(services: Services, request: Request, caller: Caller) -> Response:
    """POST /tag/info ``{"names": [...]}`` (LiteLLM's form): ``{name: info}``."""
    body = await begin(services, request)
    only(body, "names")
    out: dict[str, Any] = {}
    headers: dict[str, str] = {}
    for name in dict.fromkeys(str_list(body, "names")):
        out[name], _, more = await _info_of(TAGS, services, name)
        headers.update(more)
    return Response.json(out, headers=headers)


async def list_all(api: EntityApi, services: Services, request: Request, caller: Caller
                   ) -> Response:
    """GET /<entity>/list?page=&size=: a bare array (LiteLLM's shape), or for users a
    paged object. Users who are not admins or viewers list the teams they belong to."""
    page, size = paging(request.query, default_size=100 if api.list_key else 1000)
    store = store_of(services)
    if caller.sees_all:
        with sql(f"list {api.label}s"):
            rows, total = await api.store_call(store, "list")(page=page, size=size)
    else:  # only teams reach here (RULES): the caller's own
        with sql(f"list {api.label}s"):
            found = await store.get_teams(sorted(caller.member_of))
        rows, total = list(found.values()), len(found)
    items = [render_row(r) for r in rows]
    if api.kind == "team":
        with sql("list team members"):
            members = await store.team_members([r.team_id for r in rows])
        for item in items:
            item["members_with_roles"] = [render_member(m) for m in members[item["team_id"]]]
    if api.list_key is None:
        return Response.json(items)
    return Response.json({api.list_key: items, "total": total, "page": page,
                          "page_size": size, "total_pages": page_count(total, size)})


def handlers(api: EntityApi) -> dict[str, Callable[..., Any]]:
    """The entity's handlers, by verb, bound to ``api``."""
    return {
        "new": partial(new, api),
        "update": partial(update, api),
        "delete": partial(delete, api),
        "info": partial(info, api),
        "list": partial(list_all, api),
        "block": partial(set_blocked, api, True),
        "unblock": partial(set_blocked, api, False),
    }

