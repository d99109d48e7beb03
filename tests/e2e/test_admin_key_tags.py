"""A tag with a budget or limits goes on a key only from someone entitled to it: an
internal user or a team admin may put on the keys it creates or changes only such tags
as its own key or team, or the key's team, already has. A proxy admin may put any."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.test_admin_api import Admin, admin_client

if TYPE_CHECKING:

    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


async def _people(api: Admin) -> dict[str, str]:
    """Teams t1 (tag ``t1-tag``) and t2 (tag ``t2-tag``), both tags budgeted, a tag
    ``free`` without limits; ``alice`` an internal user in t1, ``bob`` t1's admin. Their
    keys, by name."""
    for tag in ("t1-tag", "t2-tag"):
        await api.post("/tag/new", {"name": tag, "max_budget": 10})
    await api.post("/tag/new", {"name": "free"})
    await api.post("/team/new", {"team_id": "t1", "metadata": {"tags": ["t1-tag"]},
                                 "members_with_roles": [{"user_id": "alice", "role": "user"},
                                                        {"user_id": "bob", "role": "admin"}]})
    await api.post("/team/new", {"team_id": "t2", "metadata": {"tags": ["t2-tag"]}})
    keys = {}
    for user, role in (("alice", "internal_user"), ("bob", "internal_user_viewer")):
        await api.post("/user/update", {"user_id": user, "user_role": role})
        keys[user] = (await api.post("/key/generate", {"user_id": user, "team_id": "t1"}))["key"]
    return keys


@pytest.mark.parametrize("who", ["alice", "bob"])
@pytest.mark.parametrize("where", ["tags", "metadata"])
async def test_another_teams_budgeted_tag_cannot_go_on_a_key(
    gateway: Gateway, api: Admin, who: str, where: str,
) -> None:
    keys = await _people(api)

    def with_tags(*tags: str) -> dict[str, object]:
        body: dict[str, object] = {"team_id": "t1"}
        body.update({"tags": list(tags)} if where == "tags" else {"metadata": {"tags": list(tags)}})
        return body

    async with admin_client(gateway, keys[who]) as caller:
        error = await caller.post("/key/generate", with_tags("t2-tag"), status=403)
        assert "t2-tag" in error["error"]["message"]
        await caller.post("/key/generate", with_tags("t1-tag", "t2-tag"), status=403)
        # Its own team's tag, and a tag without limits, are fine.
        await caller.post("/key/generate", with_tags("t1-tag", "free"))
        mine = await caller.post("/key/generate", with_tags())
        # Nor may a key it may change get one later.
        await caller.post("/key/update", {"key": mine["key"], **with_tags("t2-tag")},
                          status=403)
    info = await api.get("/key/info", key=mine["key"])
    assert "t2-tag" not in str(info["info"]["tags"]) + str(info["info"]["metadata"])
    # A proxy admin may.
    await api.post("/key/generate", with_tags("t2-tag"))
