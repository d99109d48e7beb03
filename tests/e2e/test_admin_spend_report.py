"""``GET /global/spend/report`` over real HTTP, in LiteLLM's documented shapes: per day
and team, per day and customer, per key (also for one key or one user's keys); and the
spend rows' LiteLLM fields (``metadata``, ``cache_key``, ``api_base``, and with
``store_prompts_in_spend_logs`` the ``messages`` and ``response``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway, spend_rows
from tests.e2e.test_admin_api import MESSAGES, Admin, admin_client, chat, sdk
from triogate.store import hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


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


async def test_spend_rows_carry_litellm_metadata_cache_key_and_api_base(
        gateway: Gateway, api: Admin) -> None:
    await api.post("/team/new", {"team_id": "t1"})
    key = (await api.post("/key/generate", {"team_id": "t1", "key_alias": "ci"}))["key"]
    with trio.fail_after(20):
        await sdk(gateway, key).chat.completions.create(
            model="gpt-test", messages=MESSAGES, user="palantir",  # type: ignore[arg-type]
            extra_body={"metadata": {"tags": ["nightly"], "job": "ci-42",
                                     "spend_logs_metadata": {"cost_center": "R&D"}}})
    await spend_rows(gateway, 1)
    (row,) = await api.get("/spend/logs")
    assert row["metadata"]["user_api_key"] == hash_key(key)
    assert row["metadata"]["user_api_key_alias"] == "ci"
    assert row["metadata"]["user_api_key_team_id"] == "t1"
    assert row["metadata"]["user_api_key_end_user_id"] == "palantir"
    assert row["metadata"]["requester_metadata"]["job"] == "ci-42"
    assert row["metadata"]["spend_logs_metadata"] == {"cost_center": "R&D"}
    assert row["api_base"].endswith("/v1") and row["api_base"].startswith("http://127.0.0.1")
    assert row["cache_key"] is None  # the response cache is off here
    assert row["messages"] is None and row["response"] is None  # prompts are not stored


@pytest.fixture
async def storing(tmp_path: Path, redis: RespBackend, redis_url: str,
                  upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    """A gateway with the response cache on and store_prompts_in_spend_logs."""
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            litellm_settings={"cache": True},
                            general_settings={"store_prompts_in_spend_logs": True})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


async def test_store_prompts_in_spend_logs_keeps_messages_and_response(
        storing: Gateway) -> None:
    async with admin_client(storing) as api:
        key = (await api.post("/key/generate", {}))["key"]
        with trio.fail_after(20):
            answer = await sdk(storing, key).chat.completions.create(
                model="gpt-test", messages=MESSAGES)  # type: ignore[arg-type]
        await spend_rows(storing, 1)
        (row,) = await api.get("/spend/logs")
        assert row["messages"] == MESSAGES
        assert row["response"]["id"] == answer.id
        assert row["response"]["choices"][0]["message"]["content"] == (
            answer.choices[0].message.content)
        assert isinstance(row["cache_key"], str) and row["cache_key"]
        # A stream (not cached: no-store): its answer is assembled from its events.
        other = [{"role": "user", "content": "another question, streamed"}]
        with trio.fail_after(20):
            stream = await sdk(storing, key).chat.completions.create(
                model="gpt-test", messages=other, stream=True,  # type: ignore[arg-type]
                extra_body={"cache": {"no-store": True}})
            text = "".join([c.choices[0].delta.content or "" async for c in stream
                            if c.choices])
        await spend_rows(storing, 2)
        streamed = next(r for r in await api.get("/spend/logs") if r["messages"] == other)
    assert text and streamed["response"]["choices"][0]["message"]["content"] == text
