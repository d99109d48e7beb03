"""``GET /global/spend/report`` over real HTTP, in LiteLLM's documented shapes: per day
and team, per day and customer, per key (also for one key or one user's keys)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
import trio

from tests.e2e.conftest import spend_rows
from tests.e2e.test_admin_api import MESSAGES, Admin, admin_client, chat, sdk
from triogate.store import hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture
async def api(gateway: Gateway) -> AsyncIterator[Admin]:
    async with admin_client(gateway) as client:
        yield client


def _range(days_before: int = 0) -> dict[str, str]:
    today = datetime.now(UTC).date()
    return {"start_date": (today - timedelta(days=days_before)).isoformat(),
            "end_date": today.isoformat()}


async def test_spend_report_per_team_customer_and_key(gateway: Gateway, api: Admin) -> None:
    await api.post("/team/new", {"team_id": "t-prod", "team_alias": "Prod Team"})
    await api.post("/user/new", {"user_id": "ishaan", "auto_create_key": False})
    prod = (await api.post("/key/generate", {"team_id": "t-prod", "user_id": "ishaan"}))[
        "key"]
    loose = (await api.post("/key/generate", {}))["key"]
    await chat(gateway, prod)
    await chat(gateway, prod, "claude-test")
    with trio.fail_after(20):
        await sdk(gateway, loose).chat.completions.create(
            model="gpt-test", messages=MESSAGES, user="palantir")  # type: ignore[arg-type]
    rows = await spend_rows(gateway, 3)
    total = sum(r.cost_nanousd for r in rows)
    assert total > 0

    (day,) = await api.get("/global/spend/report", **_range(1), group_by="team")
    assert day["group_by_day"] == f"{datetime.now(UTC).date().isoformat()}T00:00:00+00:00"
    teams = {t["team_name"]: t for t in day["teams"]}
    assert set(teams) == {"Prod Team", "Unassigned Team"}
    prod_rows = [r for r in rows if r.team_id == "t-prod"]
    assert teams["Prod Team"]["total_spend_nanousd"] == sum(r.cost_nanousd for r in prod_rows)
    assert {(m["model"], m["api_key"]) for m in teams["Prod Team"]["metadata"]} == {
        ("gpt-test", hash_key(prod)), ("claude-test", hash_key(prod))}
    assert all(m["total_tokens"] > 0 for m in teams["Prod Team"]["metadata"])
    # The default grouping is by team.
    assert await api.get("/global/spend/report", **_range()) == [day]

    (day,) = await api.get("/global/spend/report", **_range(), group_by="customer")
    customers = {c["customer"]: c for c in day["customers"]}
    assert set(customers) == {"palantir", "Unassigned Customer"}
    assert customers["palantir"]["metadata"][0]["api_key"] == hash_key(loose)

    by_key = await api.get("/global/spend/report", **_range(), group_by="api_key")
    assert {k["api_key"] for k in by_key} == {hash_key(prod), hash_key(loose)}
    assert sum(k["total_cost_nanousd"] for k in by_key) == total
    (one,) = await api.get("/global/spend/report", **_range(), api_key=prod)
    assert one["api_key"] == hash_key(prod)
    assert {m["model"] for m in one["model_details"]} == {"gpt-test", "claude-test"}
    assert one["total_input_tokens"] == sum(r.input_tokens for r in prod_rows)
    (mine,) = await api.get("/global/spend/report", **_range(), internal_user_id="ishaan")
    assert mine == one
    # Another range holds nothing.
    assert await api.get("/global/spend/report", start_date="2020-01-01",
                         end_date="2020-01-31") == []


async def test_spend_report_checks_its_query_and_its_caller(gateway: Gateway,
                                                           api: Admin) -> None:
    error = (await api.get("/global/spend/report", status=400,
                           end_date="2024-01-01"))["error"]
    assert error["param"] == "start_date"
    await api.get("/global/spend/report", **_range(), group_by="model", status=400)
    await api.get("/global/spend/report", start_date="2024-02-01", end_date="2024-01-01",
                  status=400)
    user = await api.post("/user/new", {"user_id": "u"})
    async with admin_client(gateway, user["key"]) as someone:
        await someone.get("/global/spend/report", **_range(), status=403)
