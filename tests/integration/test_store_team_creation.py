"""A team, its new users and its members are created in one transaction, on SQLite and
PostgreSQL: concurrent creations naming the same new user all succeed with their
members, and a creation that fails leaves no team behind."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from triogate.store import StoreConflict

if TYPE_CHECKING:
    from triogate.store import Store

pytestmark = pytest.mark.integration


async def test_concurrent_teams_naming_the_same_new_user_all_get_it(store: Store) -> None:
    created: list[str] = []

    async def create(i: int) -> None:
        team = await store.create_team(team_alias=f"t{i}",
                                       members=[("newcomer", "user", None)],
                                       create_users=["newcomer"])
        created.append(team.team_id)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(create, i)
        members = await store.team_members(created)
        teams, total = await store.list_teams(page=1, size=100)
    assert len(created) == 10 and total == 10
    assert all([m.user_id for m in members[t]] == ["newcomer"] for t in created)
    assert {t.team_id for t in teams} == set(created)


async def test_a_team_whose_members_cannot_be_added_is_not_created(store: Store) -> None:
    with trio.fail_after(20):
        with pytest.raises(StoreConflict):  # the same member twice
            await store.create_team(team_id="half", members=[
                ("twice", "user", None), ("twice", "admin", None)], create_users=["twice"])
        assert await store.get_teams(["half"]) == {}
        assert await store.get_users(["twice"]) == {}
        with pytest.raises(StoreConflict):  # the team exists: nor are its users created
            await store.create_team(team_id="taken")
            await store.create_team(team_id="taken", members=[("late", "user", None)],
                                    create_users=["late"])
        assert await store.get_users(["late"]) == {}
