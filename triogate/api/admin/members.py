"""``/team/member_add``, ``/team/member_delete``, ``/team/member_update``: LiteLLM's
``members_with_roles``.

A member is ``{"role": "admin" | "user", "user_id": ..., "user_email": ...}`` (an id or an
e-mail). Adding a member who is not a user yet creates the user (an ``internal_user``),
as LiteLLM does. Team admins manage their own team's members (``roles.RULES``). Every
change of one request happens in one transaction: all of it, or nothing.

**Per-member limits.** ``max_budget_in_team`` (USD; on ``member_add`` for every member
it adds, on ``member_update``), ``tpm_limit`` and ``rpm_limit`` (``member_update``) bound
what the member spends and sends through the team's keys that belong to it (``user_id``
of the key), per period of the team's ``budget_duration``. They are reserved with the
key's, team's and user's own, in the same pre-call round (no extra Redis wait). Each
change is announced like the team's, so it takes effect on every process within a
second; null clears a limit.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from triogate.api.admin.bounds import bad, check_text
from triogate.api.admin.common import announce, begin, not_found, sql, store_of
from triogate.api.admin.converters import FieldContext
from triogate.api.admin.fields import (
    count,
    only,
    parse_fields,
    render_member,
    render_row,
    required_str,
    usd_to_nanousd,
)
from triogate.api.admin.roles import forbidden
from triogate.api.errors import ApiError
from triogate.api.http import Response

if TYPE_CHECKING:
    from triogate.api.admin.converters import Converter
    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.store import Store

MEMBER_ROLES = ("admin", "user")
_NO_CTX = FieldContext(groups=frozenset(), now_ms=0)


def _budget_in_team(name: str, value: Any, ctx: FieldContext) -> dict[str, Any]:
    return {"max_budget_nanousd": None if value is None else usd_to_nanousd(name, value)}


#: The member bodies' limit fields (for the migration page's field table too).
MEMBER_FIELDS: dict[str, Converter] = {
    "max_budget_in_team": _budget_in_team,
    "tpm_limit": count("tpm_limit"),
    "rpm_limit": count("rpm_limit"),
}


def parse_member(name: str, value: Any) -> tuple[str | None, str | None, str]:
    """``(user_id, user_email, role)`` of one member object."""
    if not isinstance(value, dict):
        raise bad(name, "must be an object {role, user_id | user_email}")
    unknown = sorted(set(value) - {"role", "user_id", "user_email"})
    if unknown:
        raise bad(name, f"has unknown field(s) {', '.join(unknown)}")
    role = value.get("role", "user")
    if role not in MEMBER_ROLES:
        raise bad(name, "role must be 'admin' or 'user'")
    user_id, email = value.get("user_id"), value.get("user_email")
    for field, text in (("user_id", user_id), ("user_email", email)):
        if text is not None and (not isinstance(text, str) or not text):
            raise bad(name, f"{field} must be a non-empty string")
        if text is not None:
            check_text(name, text)
    if user_id is None and email is None:
        raise bad(name, "needs a user_id or a user_email")
    return user_id, email, role


def parse_members(name: str, value: Any) -> list[tuple[str | None, str | None, str]]:
    """One member object, or a list of them."""
    items = value if isinstance(value, list) else [value]
    if not items or len(items) > 1000:
        raise bad(name, "must name 1 to 1000 members")
    return [parse_member(name, item) for item in items]


async def member_ids(store: Store, wanted: list[tuple[str | None, str | None, str]]
                    ) -> tuple[list[tuple[str, str, str | None]], list[str]]:
    """Members as ``(user_id, role, email)`` and the users to create. A checkpoint."""
    out: list[tuple[str, str, str | None]] = []
    create: list[str] = []
    with sql("look up users"):
        for user_id, email, role in wanted:
            if user_id is None:
                rows, _ = await store.list_users(user_email=email, page=1, size=1)
                user_id = rows[0].user_id if rows else str(uuid.uuid4())
            if user_id not in await store.get_users([user_id]):
                create.append(user_id)
            out.append((user_id, role, email))
    return out, list(dict.fromkeys(create))


async def _team(services: Services, caller: Caller, body: dict[str, Any]) -> Any:
    team_id = required_str(body, "team_id")
    if not caller.may_manage_team(team_id):
        raise forbidden(f"manage the members of team '{team_id}'")
    with sql(f"look up team '{team_id}'"):
        team = (await store_of(services).get_teams([team_id])).get(team_id)
    if team is None:
        raise not_found("team", team_id, "team_id")
    return team


async def _answer(services: Services, team: Any, headers: dict[str, str] | None = None,
                  **extra: Any) -> Response:
    with sql("list team members"):
        members = (await store_of(services).team_members([team.team_id]))[team.team_id]
    return Response.json({**render_row(team),
                          "members_with_roles": [render_member(m) for m in members], **extra},
                         headers=headers or {})


async def member_add(services: Services, request: Request, caller: Caller) -> Response:
    """POST /team/member_add ``{team_id, member: {...} | [{...}], max_budget_in_team}``."""
    body = await begin(services, request)
    only(body, "team_id", "member", "max_budget_in_team")
    limits = parse_fields({k: v for k, v in body.items() if k == "max_budget_in_team"},
                          MEMBER_FIELDS, _NO_CTX)
    if "member" not in body:
        raise ApiError(400, "missing required field 'member'", param="member")
    wanted = parse_members("member", body["member"])
    team = await _team(services, caller, body)
    store = store_of(services)
    members, create = await member_ids(store, wanted)
    with sql("list team members"):
        present = {m.user_id for m in (await store.team_members([team.team_id]))[team.team_id]}
    already = [user_id for user_id, _, _ in members if user_id in present]
    if already:
        raise ApiError(409, f"already a member of team '{team.team_id}': "
                       f"{', '.join(map(repr, already))} (change a role with "
                       "/team/member_update); nothing was added", "invalid_request_error",
                       param="member", code="conflict")
    with sql(f"add members to team '{team.team_id}'"):
        await store.change_team_members(team.team_id, add=members, create_users=create,
                                        add_limits=limits)
    headers = await announce(services, ("team", team.team_id)) if limits else {}
    return await _answer(services, team, headers, updated_users=create,
                         updated_team_memberships=[m[0] for m in members])


async def _existing_member(services: Services, team_id: str, body: dict[str, Any],
                           *, status: int = 404) -> str:
    user_id, email = body.get("user_id"), body.get("user_email")
    if user_id is None and email is None:
        raise ApiError(400, "missing required field 'user_id' (or 'user_email')",
                       param="user_id")
    with sql("list team members"):
        members = (await store_of(services).team_members([team_id]))[team_id]
    for m in members:
        if (user_id is not None and m.user_id == user_id) or (
                user_id is None and m.user_email == email):
            return m.user_id
    if status == 400:  # LiteLLM's answer to removing someone who is not a member
        raise ApiError(400, f"'{user_id or email}' is not a member of team '{team_id}'; "
                       "nothing was removed", "invalid_request_error", param="user_id",
                       code="not_a_member")
    raise not_found("team member", str(user_id or email), "user_id")


async def member_delete(services: Services, request: Request, caller: Caller) -> Response:
    """POST /team/member_delete ``{team_id, user_id | user_email}``."""
    body = await begin(services, request)
    only(body, "team_id", "user_id", "user_email")
    team = await _team(services, caller, body)
    user_id = await _existing_member(services, team.team_id, body, status=400)
    with sql(f"remove a member of team '{team.team_id}'"):
        await store_of(services).change_team_members(team.team_id, remove=[user_id])
    # The member's own limits in the team no longer apply to its keys.
    return await _answer(services, team, await announce(services, ("team", team.team_id)))


async def member_update(services: Services, request: Request, caller: Caller) -> Response:
    """POST /team/member_update ``{team_id, user_id | user_email, role}``."""
    body = await begin(services, request)
    only(body, "team_id", "user_id", "user_email", "role", *MEMBER_FIELDS)
    limits = parse_fields({k: v for k, v in body.items() if k in MEMBER_FIELDS},
                          MEMBER_FIELDS, _NO_CTX)
    role = body.get("role")
    if role is not None and role not in MEMBER_ROLES:
        raise bad("role", "must be 'admin' or 'user'")
    team = await _team(services, caller, body)
    user_id = await _existing_member(services, team.team_id, body)
    if role is not None or limits:
        with sql(f"update a member of team '{team.team_id}'"):
            await store_of(services).change_team_members(
                team.team_id, roles={user_id: role} if role is not None else None,
                limits={user_id: limits} if limits else None)
    headers = await announce(services, ("team", team.team_id)) if limits else {}
    return await _answer(services, team, headers)
