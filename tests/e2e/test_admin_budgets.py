"""LiteLLM's budget table (``/budget/*``, ``budget_id``) and spend logs a client can match
to its responses, over real HTTP, bodies as LiteLLM documents
them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY
from tests.e2e.test_admin_api import Admin, poll

if TYPE_CHECKING:

    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

HI = [{"role": "user", "content": "say something short"}]


def sdk(gateway: Gateway, key: str = MASTER_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0)


async def test_budget_crud_in_litellms_shapes(api: Admin) -> None:
    made = await api.post("/budget/new", {
        "budget_id": "starter", "max_budget": 0.5, "budget_duration": "30d",
        "tpm_limit": 1000, "rpm_limit": 10, "max_parallel_requests": None,
        "soft_budget": None, "model_max_budget": None, "budget_reset_at": None})
    assert (made["budget_id"], made["max_budget"], made["max_budget_nanousd"]) == (
        "starter", 0.5, 500_000_000)
    assert made["rpm_limit"] == 10 and made["budget_duration"] == "30d"
    generated = await api.post("/budget/new", {"max_budget": 1})
    assert len(generated["budget_id"]) == 36  # a UUID, as LiteLLM makes one
    info = await api.post("/budget/info", {"budgets": ["starter"]})
    assert [b["budget_id"] for b in info] == ["starter"]
    await api.post("/budget/info", {"budgets": ["nope"]}, status=404)
    assert {b["budget_id"] for b in await api.get("/budget/list")} == {
        "starter", generated["budget_id"]}
    updated = await api.post("/budget/update", {"budget_id": "starter", "rpm_limit": 20})
    assert updated["rpm_limit"] == 20 and updated["max_budget"] == 0.5
    refused = (await api.post("/budget/new", {"budget_id": "x", "soft_budget": 1},
                              status=400))["error"]
    assert refused["param"] == "soft_budget" and "soft budgets" in refused["message"]
    await api.post("/budget/new", {"budget_id": "starter"}, status=409)
    await api.post("/budget/update", {"budget_id": "nope", "rpm_limit": 1}, status=404)
    assert (await api.post("/budget/delete", {"id": generated["budget_id"]}))["deleted"] == [
        generated["budget_id"]]
    await api.post("/budget/delete", {"id": generated["budget_id"]}, status=404)


async def test_budget_id_gives_its_limits_to_customers_users_teams_and_keys(
        gateway: Gateway, api: Admin) -> None:
    await api.post("/budget/new", {"budget_id": "tiny", "max_budget": 0.0000001,
                                   "rpm_limit": 50})
    customer = await api.post("/customer/new", {"user_id": "acme", "budget_id": "tiny"})
    assert (customer["budget_id"], customer["max_budget_nanousd"], customer["rpm_limit"]) == (
        "tiny", 100, 50)
    assert customer["litellm_budget_table"]["budget_id"] == "tiny"  # LiteLLM's nesting
    team = await api.post("/team/new", {"team_id": "tb", "budget_id": "tiny"})
    user = await api.post("/user/new", {"user_id": "ub", "budget_id": "tiny",
                                        "auto_create_key": False})
    key = await api.post("/key/generate", {"budget_id": "tiny"})
    for row in (team, user, key):
        assert (row["budget_id"], row["max_budget_nanousd"]) == ("tiny", 100)

    # Each customer counts on its own; the master key meets the customer's budget.
    with trio.fail_after(20):
        await sdk(gateway).chat.completions.create(model="gpt-test", messages=HI, user="acme")
        await gateway.services.settler.wait_drained()
    with trio.fail_after(20), pytest.raises(openai.BadRequestError) as info:
        await sdk(gateway).chat.completions.create(model="gpt-test", messages=HI, user="acme")
    message = info.value.body["message"]  # type: ignore[index]
    assert message.startswith("Budget has been exceeded!") and "$0.0000001" in message

    # Limits come from the budget: not settable beside it, changed through it.
    error = (await api.post("/customer/update", {"user_id": "acme", "max_budget": 5},
                            status=400))["error"]
    assert error["param"] == "max_budget" and "budget 'tiny'" in error["message"]
    await api.post("/key/generate", {"budget_id": "tiny", "rpm_limit": 1}, status=400)
    # LiteLLM's UpdateCustomerRequest as its clients send it: nulls ask for nothing.
    resent = await api.post("/customer/update", {
        "user_id": "acme", "alias": None, "blocked": False, "max_budget": None,
        "budget_id": "tiny", "allowed_model_region": None, "default_model": None})
    assert (resent["max_budget_nanousd"], resent["rpm_limit"]) == (100, 50)
    kept = await api.post("/team/update", {"team_id": "tb", "max_budget": None,
                                           "rpm_limit": None, "tpm_limit": None})
    assert (kept["max_budget_nanousd"], kept["rpm_limit"]) == (100, 50)
    missing = (await api.post("/team/new", {"budget_id": "nope"}, status=400))["error"]
    assert missing["code"] == "budget_not_found"
    await api.post("/budget/update", {"budget_id": "tiny", "max_budget": 100})
    for path, params in (("/customer/info", {"end_user_id": "acme"}),
                         ("/team/info", {"team_id": "tb"})):
        row = await api.get(path, **params)
        row = row.get("team_info", row)
        assert row["max_budget"] == 100.0
    nested = (await api.get("/customer/info", end_user_id="acme"))["litellm_budget_table"]
    assert (nested["budget_id"], nested["max_budget"], nested["rpm_limit"]) == (
        "tiny", 100.0, 50)
    with trio.fail_after(20):  # the raised budget reached the gateway's identity cache
        await sdk(gateway).chat.completions.create(model="gpt-test", messages=HI, user="acme")

    # In use: not deletable. Detached: the limits stay, now its own.
    busy = (await api.post("/budget/delete", {"id": "tiny"}, status=400))["error"]
    assert busy["code"] == "budget_in_use" and "nothing was deleted" in busy["message"]
    for path, body in (("/customer/update", {"user_id": "acme"}),
                       ("/team/update", {"team_id": "tb"}),
                       ("/user/update", {"user_id": "ub"}),
                       ("/key/update", {"key": key["key"]})):
        detached = await api.post(path, {**body, "budget_id": None})
        assert detached["budget_id"] is None and detached["max_budget"] == 100.0
    await api.post("/budget/delete", {"id": "tiny"})


async def test_a_spend_row_is_found_by_the_responses_request_id(
        gateway: Gateway, api: Admin) -> None:
    with trio.fail_after(20):
        mine = await sdk(gateway).chat.completions.with_raw_response.create(
            model="gpt-test", messages=HI)
        theirs = await sdk(gateway).chat.completions.with_raw_response.create(
            model="gpt-test", messages=HI, extra_headers={"x-request-id": "client-id-1"})
    request_id = mine.headers["x-request-id"]
    assert mine.headers["x-litellm-call-id"] == request_id
    assert theirs.headers["x-request-id"] == "client-id-1"

    async def logged() -> bool:
        return len(await api.get("/spend/logs")) == 2

    await poll(logged, timeout_s=10, interval_s=0.1)
    rows: list[dict[str, Any]] = await api.get("/spend/logs", request_id=request_id)
    assert [r["request_id"] for r in rows] == [request_id]
    assert rows[0]["response_id"] == mine.parse().id and rows[0]["client_request_id"] is None
    by_client = await api.get("/spend/logs", request_id="client-id-1")
    assert [r["client_request_id"] for r in by_client] == ["client-id-1"]
    assert by_client[0]["request_id"] == theirs.headers["x-litellm-call-id"]
    assert await api.get("/spend/logs", request_id="nope") == []
