"""``/team/new`` is all or nothing: ten concurrent calls naming the same new user each
create their team with that member; none leaves a team without its members."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests.e2e.test_admin_api import admin_client

if TYPE_CHECKING:
    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


async def test_concurrent_team_creations_naming_the_same_new_user(gateway: Gateway) -> None:
    answers: list[Any] = []
    async with admin_client(gateway) as api:

        async def create(i: int) -> None:
            answers.append(await api.http.post("/team/new", json={
                "team_alias": f"team-{i}",
                "members_with_roles": [{"user_id": "newcomer", "role": "user"}]}))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(create, i)
        assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers]
        teams = (await api.http.get("/team/list")).json()
        assert len(teams) == 10
        for team in teams:
            info = (await api.http.get("/team/info", params={"team_id": team["team_id"]})).json()
            assert [m["user_id"] for m in info["team_info"]["members_with_roles"]] == [
                "newcomer"]
        user = (await api.http.get("/user/info", params={"user_id": "newcomer"})).json()
        assert len(user["teams"]) == 10
