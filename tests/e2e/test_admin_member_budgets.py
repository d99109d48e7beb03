"""Per-member budgets inside a team (``max_budget_in_team`` on ``/team/member_add`` and
``/team/member_update``) over real HTTP: enforced on the member's keys of that team,
reserved in the same pre-call round as the other budgets (one wait before the model
call, one after), changed everywhere within a second."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import traced_waits
from tests.e2e.test_admin_api import Admin, chat, poll, status_of

if TYPE_CHECKING:

    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


async def _over_budget(gateway: Gateway, key: str) -> str | None:
    """The budget error's message, or None when the request went through."""
    try:
        await chat(gateway, key)
    except openai.BadRequestError as exc:
        assert exc.code == "budget_exceeded", exc
        return str(exc)
    return None


async def test_max_budget_in_team_is_enforced_on_the_members_team_keys(
        gateway: Gateway, api: Admin) -> None:
    await api.post("/team/new", {"team_id": "eng", "team_alias": "Engineering",
                                 "max_budget": 100})
    added = await api.post("/team/member_add", {
        "team_id": "eng", "member": [{"role": "user", "user_id": "ada"}],
        "max_budget_in_team": "0.000001"})
    (ada,) = added["members_with_roles"]
    assert ada["max_budget_in_team"] == 0.000001 and ada["max_budget_in_team_nanousd"] == 1000
    assert ada["litellm_budget_table"]["max_budget"] == 0.000001
    await api.post("/team/member_add", {"team_id": "eng",
                                        "member": {"role": "user", "user_id": "bob"}})
    in_team = (await api.post("/key/generate", {"team_id": "eng", "user_id": "ada"}))["key"]
    outside = (await api.post("/key/generate", {"user_id": "ada"}))["key"]
    bob = (await api.post("/key/generate", {"team_id": "eng", "user_id": "bob"}))["key"]
    assert await _over_budget(gateway, in_team) is None  # a fresh period admits one

    async def exceeded() -> bool:
        return await _over_budget(gateway, in_team) is not None

    await poll(exceeded, timeout_s=5, interval_s=0.1)
    message = await _over_budget(gateway, in_team)
    assert message is not None and "ada in team Engineering" in message
    # Her key outside the team, and another member, are not bound by it.
    assert (await chat(gateway, outside)).choices
    assert (await chat(gateway, bob)).choices
    # Raising it (member_update) lets her in again; a rate limit of one then applies.
    await api.post("/team/member_update", {"team_id": "eng", "user_id": "ada",
                                           "max_budget_in_team": 100, "rpm_limit": 1})
    assert (await chat(gateway, in_team)).choices
    assert await status_of(gateway, in_team) == 429
    # Clearing the limits, or removing her from the team, lifts them.
    cleared = await api.post("/team/member_update", {
        "team_id": "eng", "user_id": "ada", "max_budget_in_team": None, "rpm_limit": None})
    assert cleared["members_with_roles"][0]["litellm_budget_table"] is None
    assert (await chat(gateway, in_team)).choices
    await api.post("/team/member_update", {"team_id": "eng", "user_id": "ada",
                                           "max_budget_in_team": 0})
    assert await _over_budget(gateway, in_team) is not None
    await api.post("/team/member_delete", {"team_id": "eng", "user_id": "ada"})
    assert (await chat(gateway, in_team)).choices


async def test_member_limits_are_validated(api: Admin) -> None:
    await api.post("/team/new", {"team_id": "eng"})
    member = {"role": "user", "user_id": "ada"}
    for bad in (-1, "lots", True):
        error = (await api.post("/team/member_add", {
            "team_id": "eng", "member": member, "max_budget_in_team": bad},
            status=400))["error"]
        assert error["param"] == "max_budget_in_team"
    assert (await api.get("/team/info", team_id="eng"))["team_info"][
        "members_with_roles"] == []
    await api.post("/team/member_add", {"team_id": "eng", "member": member})
    await api.post("/team/member_update", {"team_id": "eng", "user_id": "ada",
                                           "tpm_limit": -5}, status=400)


async def test_a_member_budget_adds_no_redis_wait(gateway: Gateway, api: Admin) -> None:
    await api.post("/team/new", {"team_id": "eng", "max_budget": 100,
                                 "budget_duration": "30d"})
    await api.post("/team/member_add", {"team_id": "eng", "max_budget_in_team": 10,
                                        "member": {"role": "user", "user_id": "ada"}})
    await api.post("/team/member_update", {"team_id": "eng", "user_id": "ada",
                                           "tpm_limit": 1_000_000, "rpm_limit": 1000})
    key = (await api.post("/key/generate", {"team_id": "eng", "user_id": "ada",
                                            "max_budget": 5}))["key"]
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "count"}]}
    async with httpx.AsyncClient(timeout=20) as http:
        for _ in range(2):  # the first one loads the identity into memory
            with trio.fail_after(20):
                response = await http.post(f"{gateway.openai_base}/chat/completions",
                                           json=body,
                                           headers={"authorization": f"Bearer {key}"})
            summary = await traced_waits(gateway, response)
    assert (summary.waits_before, summary.waits_after) == (1, 1)
    info = await api.get("/team/info", team_id="eng")
    (ada,) = info["team_info"]["members_with_roles"]
    assert ada["max_budget_in_team"] == 10.0
