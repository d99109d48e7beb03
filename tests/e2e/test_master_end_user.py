"""An end user's budget and limits apply whoever calls, the master key included."""

from __future__ import annotations

from typing import TYPE_CHECKING

import openai
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY

if TYPE_CHECKING:
    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

HI = [{"role": "user", "content": "say something short"}]


def client(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY, max_retries=0)


async def test_the_master_key_meets_the_end_users_rate_limit(gateway: Gateway) -> None:
    store = gateway.services.store
    assert store is not None
    await store.create_end_user(user_id="cust-rpm", rpm_limit=1)
    with trio.fail_after(20):
        raw = await client(gateway).chat.completions.with_raw_response.create(
            model="gpt-test", messages=HI, user="cust-rpm")
    assert raw.headers["x-ratelimit-limit-requests"] == "1"
    with trio.fail_after(20), pytest.raises(openai.RateLimitError):
        await client(gateway).chat.completions.create(
            model="gpt-test", messages=HI, user="cust-rpm")
    with trio.fail_after(20):  # another end user, and no end user, are not limited
        await client(gateway).chat.completions.create(
            model="gpt-test", messages=HI, user="someone-else")
        await client(gateway).chat.completions.create(model="gpt-test", messages=HI)


async def test_the_master_key_meets_the_end_users_budget(gateway: Gateway) -> None:
    store = gateway.services.store
    assert store is not None
    await store.create_end_user(user_id="cust-budget", max_budget_nanousd=1)
    with trio.fail_after(20):
        await client(gateway).chat.completions.create(
            model="gpt-test", messages=HI, user="cust-budget")
        await gateway.services.settler.wait_drained()
    with trio.fail_after(20), pytest.raises(openai.BadRequestError) as info:
        await client(gateway).chat.completions.create(
            model="gpt-test", messages=HI, user="cust-budget")
    assert info.value.body["code"] == "budget_exceeded"  # type: ignore[index]


async def test_a_blocked_end_user_is_refused_to_the_master_key(gateway: Gateway) -> None:
    store = gateway.services.store
    assert store is not None
    await store.create_end_user(user_id="cust-blocked", blocked=True)
    with trio.fail_after(20), pytest.raises(openai.PermissionDeniedError):
        await client(gateway).chat.completions.create(
            model="gpt-test", messages=HI, user="cust-blocked")


async def test_the_master_key_with_an_end_user_waits_once_before_and_once_after(
    gateway: Gateway,
) -> None:
    store = gateway.services.store
    assert store is not None
    await store.create_end_user(user_id="cust-waits", rpm_limit=100,
                                max_budget_nanousd=10**12)
    summaries = []
    for _ in range(2):
        with trio.fail_after(20):
            raw = await client(gateway).chat.completions.with_raw_response.create(
                model="gpt-test", messages=HI, user="cust-waits")
            await gateway.services.settler.wait_drained()
        assert gateway.services.tracer is not None
        summaries.append(gateway.services.tracer.summary(raw.headers["x-triogate-trace-id"]))
    assert summaries[1].waits_before == 1 and summaries[1].waits_after == 1
    (before,) = [r for r in summaries[1].records if r.phase == "before"]
    # The end user's budget and RPM: one script (governance/admit.py).
    assert sorted(before.owners) == ["budgets", "routing"]
