"""Team members' own limits in the store, on SQLite and PostgreSQL: set when added, set
and cleared by an update, and read back by (team, user) pair."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from triogate.store import Store


async def test_member_limits_round_trip(store: Store) -> None:
    team = await store.create_team(team_alias="eng")
    other = await store.create_team(team_alias="ops")
    await store.change_team_members(team.team_id, add=[("ada", "user", None)],
                                    create_users=["ada"],
                                    add_limits={"max_budget_nanousd": 1000})
    await store.change_team_members(other.team_id, add=[("ada", "admin", None)])
    found = await store.team_memberships([(team.team_id, "ada"), (other.team_id, "ada"),
                                          (team.team_id, "nobody")])
    by_team = {m.team_id: m for m in found}
    assert set(by_team) == {team.team_id, other.team_id}
    assert by_team[team.team_id].max_budget_nanousd == 1000 and by_team[team.team_id].limited
    assert not by_team[other.team_id].limited
    await store.change_team_members(team.team_id, limits={"ada": {
        "max_budget_nanousd": None, "rpm_limit": 3}})
    (member,) = await store.team_memberships([(team.team_id, "ada")])
    assert (member.max_budget_nanousd, member.rpm_limit, member.tpm_limit) == (None, 3, None)
    assert member.role == "user"
