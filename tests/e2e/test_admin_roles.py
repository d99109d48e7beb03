"""Roles and self-service: every admin route, called by every role, over real
HTTP, against the one table ``roles.RULES``; then what each role sees and changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.test_admin_api import Admin, admin_client, chat, poll
from triogate.api.admin.roles import RULES, TEAM_ADMIN
from triogate.api.admin.routes import handlers_by_route
from triogate.store import hash_key

if TYPE_CHECKING:

    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

#: caller label → (user role, team t1 membership role); "master" is the master key.
PEOPLE: dict[str, tuple[str | None, str | None]] = {
    "admin-user": ("proxy_admin", None),
    "viewer": ("proxy_admin_viewer", None),
    "internal": ("internal_user", "user"),
    "internal-viewer": ("internal_user_viewer", None),
    "team-admin": ("internal_user_viewer", "admin"),
}
ROLE_OF = {"master": "proxy_admin", "admin-user": "proxy_admin",
           "viewer": "proxy_admin_viewer", "internal": "internal_user",
           "internal-viewer": "internal_user_viewer", "team-admin": TEAM_ADMIN, "key": "key"}


async def _keys(api: Admin) -> dict[str, str]:
    """A key per caller label (users created with their roles and memberships)."""
    await api.post("/team/new", {"team_id": "t1", "members_with_roles": [
        {"user_id": user, "role": member} for user, (_, member) in PEOPLE.items() if member]})
    keys = {}
    for user, (role, _) in PEOPLE.items():
        if user not in ("internal", "team-admin"):  # those two exist as members already
            await api.post("/user/new", {"user_id": user, "auto_create_key": False})
        await api.post("/user/update", {"user_id": user, "user_role": role})
        keys[user] = (await api.post("/key/generate", {"user_id": user}))["key"]
    keys["key"] = (await api.post("/key/generate", {"team_id": "t1"}))["key"]
    return keys


def _request(route: tuple[str, str], who: str, own: str) -> dict[str, Any]:
    """A request to ``route`` aimed at the caller's own things (so that only the rule,
    not ownership, can refuse it)."""
    method, path = route
    own_user = who if who in PEOPLE else None
    if path.startswith("/key/"):
        body: dict[str, Any] = {"key": own}
        if path == "/key/generate":
            body = {"team_id": "t1"} if who in ("team-admin", "internal") else {}
        elif path == "/key/delete":
            body = {"keys": [own]}
        return {"params": {"key": own}} if method == "GET" else {"json": body}
    if path.startswith("/team/member_"):
        return {"json": {"team_id": "t1", "member": {"user_id": f"new-{who}", "role": "user"},
                         "user_id": f"new-{who}"} if path.endswith("add") else
                {"team_id": "t1", "user_id": f"new-{who}"}}
    if path.startswith("/team/"):
        return {"params": {"team_id": "t1"}} if method == "GET" else {"json": {}}
    if path.startswith("/user/"):
        return {"params": {"user_id": own_user or ""}} if method == "GET" else {"json": {}}
    return {"params": {}} if method == "GET" else {"json": {}}


@pytest.mark.parametrize("who", sorted(ROLE_OF))
async def test_every_route_with_each_role(gateway: Gateway, api: Admin, who: str) -> None:
    keys = await _keys(api)
    keys["master"] = "sk-test-master"
    raw, role = keys[who], ROLE_OF[who]
    routes = sorted(handlers_by_route())
    assert set(routes) <= set(RULES)
    refusals = allowed_calls = 0
    async with admin_client(gateway, raw) as caller:
        for route in routes:
            expected = role in RULES[route].roles
            own = raw
            if route[1] in ("/key/delete", "/key/block", "/key/unblock", "/key/update",
                            "/key/regenerate") \
                    and who != "key":
                # A throwaway key the caller owns (user) or manages (team admin).
                body = {"team_id": "t1"} if who == "team-admin" else (
                    {"user_id": who} if who in PEOPLE else {})
                own = (await api.post("/key/generate", body))["key"]
            response = await caller.http.request(route[0], route[1],
                                                 **_request(route, who, own))
            if expected:
                allowed_calls += 1
                assert response.status_code not in (401, 403), (route, response.text)
            else:
                refusals += 1
                assert response.status_code == 403, (route, response.text)
                assert response.json()["error"]["type"] == "permission_error"
    assert allowed_calls + refusals == len(routes)
    assert allowed_calls >= 3  # every role may call something


async def test_a_key_reads_itself_and_nothing_else(gateway: Gateway, api: Admin) -> None:
    keys = await _keys(api)
    async with admin_client(gateway, keys["key"]) as me:
        mine = await me.get("/key/info")
        assert mine["key"] == hash_key(keys["key"])
        await me.get("/key/info", key=keys["internal"], status=404)
        assert (await me.get("/team/info"))["team_id"] == "t1"
        await me.post("/key/update", {"key": keys["key"], "max_budget": 100}, status=403)


async def test_an_internal_user_manages_its_own_keys_within_its_limits(
        gateway: Gateway, api: Admin) -> None:
    keys = await _keys(api)
    await api.post("/user/update", {"user_id": "internal", "models": ["gpt-test"],
                                    "max_budget": 1})
    async with admin_client(gateway, keys["internal"]) as me:
        made = await me.post("/key/generate", {"key_alias": "mine", "max_budget": 0.5})
        assert made["user_id"] == "internal"
        assert (await chat(gateway, made["key"])).choices
        await me.post("/key/generate", {"max_budget": 2}, status=403)
        await me.post("/key/generate", {"models": ["claude-test"]}, status=403)
        await me.post("/key/generate", {"user_id": "viewer"}, status=403)
        await me.post("/key/generate", {"team_id": "elsewhere"}, status=403)
        listed = await me.get("/key/list")
        assert hash_key(made["key"]) in listed["keys"]
        assert hash_key(keys["viewer"]) not in listed["keys"]
        await me.get("/key/list", user_id="viewer", status=403)
        await me.get("/key/info", key=keys["viewer"], status=404)
        await me.post("/key/delete", {"keys": [keys["viewer"]]}, status=403)
        await me.post("/key/update", {"key": made["key"], "key_alias": "mine-2"})
        await me.post("/key/delete", {"keys": [made["key"]]})
        assert (await me.get("/user/info"))["user_id"] == "internal"
        await me.get("/user/info", user_id="viewer", status=403)

        async def logged() -> bool:
            rows = await me.get("/spend/logs")
            return bool(rows) and {r["user"] for r in rows} == {"internal"}

        await poll(logged, timeout_s=10, interval_s=0.1)
        await me.get("/spend/logs", user_id="viewer", status=403)


async def test_a_team_admin_manages_members_and_team_keys(gateway: Gateway, api: Admin
                                                         ) -> None:
    keys = await _keys(api)
    await api.post("/team/new", {"team_id": "t2"})
    async with admin_client(gateway, keys["team-admin"]) as boss:
        added = await boss.post("/team/member_add", {"team_id": "t1", "member": [
            {"user_id": "newbie", "role": "user"}, {"user_email": "e@x.io", "role": "admin"}]})
        roles = {m["user_id"]: m["role"] for m in added["members_with_roles"]}
        assert roles["newbie"] == "user" and roles["team-admin"] == "admin"
        assert "newbie" in added["updated_users"]
        again = await boss.post("/team/member_add", {"team_id": "t1", "member": {
            "user_id": "newbie", "role": "user"}}, status=409)
        assert "already a member of team 't1'" in again["error"]["message"]
        await boss.post("/team/member_add", {"team_id": "t2", "member": {
            "user_id": "x", "role": "user"}}, status=403)
        updated = await boss.post("/team/member_update", {"team_id": "t1",
                                                          "user_id": "newbie", "role": "admin"})
        assert {m["user_id"]: m["role"] for m in updated["members_with_roles"]}["newbie"] == \
            "admin"
        team_key = await boss.post("/key/generate", {"team_id": "t1", "user_id": "newbie"})
        await boss.post("/key/generate", {"team_id": "t1", "user_id": "viewer"}, status=403)
        assert team_key["team_id"] == "t1"
        info = await boss.get("/team/info", team_id="t1")
        assert any(k["token"] == team_key["token"] for k in info["keys"])
        assert {m["user_id"] for m in info["team_info"]["members_with_roles"]} >= {
            "newbie", "internal", "team-admin"}
        await boss.post("/team/member_delete", {"team_id": "t1", "user_id": "newbie"})
        await boss.post("/team/member_delete", {"team_id": "t1", "user_id": "newbie"},
                        status=400)
        await boss.post("/team/update", {"team_id": "t1", "max_budget": 5}, status=403)
    user = await api.get("/user/info", user_id="internal")
    assert [t["team_id"] for t in user["teams"]] == ["t1"]


async def test_a_viewer_reads_everything_and_writes_nothing(gateway: Gateway, api: Admin
                                                           ) -> None:
    keys = await _keys(api)
    async with admin_client(gateway, keys["viewer"]) as viewer:
        assert (await viewer.get("/key/list"))["total_count"] == len(keys)
        await viewer.get("/key/info", key=keys["internal"])
        await viewer.get("/spend/logs")
        await viewer.post("/key/generate", {}, status=403)
        await viewer.post("/team/new", {}, status=403)
    await api.post("/user/update", {"user_id": "admin-user", "user_role": "proxy_admin"})
    async with admin_client(gateway, keys["admin-user"]) as admin:
        await admin.post("/team/new", {"team_id": "by-an-admin-user"})
    await api.post("/key/update", {"key": keys["viewer"], "blocked": True})
    async with admin_client(gateway, keys["viewer"]) as blocked:
        await blocked.get("/key/list", status=401)
