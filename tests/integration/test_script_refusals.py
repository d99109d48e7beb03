"""A script that refuses its arguments is a refusal, never "Redis unavailable": before,
an out-of-range argument made rate_admit.lua and budget_reserve.lua answer an error,
the checks failed open, and every such request passed every limit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from tests.integration.test_governance_redis import CHECK, KEY_ID, check, facts, who
from triogate.batch import BackendUnavailable, CommandError
from triogate.governance.decisions import Rejected, is_refusal
from triogate.governance.keys import PARALLEL, rate_window_key
from triogate.governance.local import LocalGovernance
from triogate.governance.principals import Limits

if TYPE_CHECKING:
    from triogate.batch import RespBackend

pytestmark = pytest.mark.integration

#: Past the scripts' integer bound (2^53): they answer an ERR reply.
HUGE = 2**60


@pytest.mark.parametrize("policy", ["fail-open", "fail-closed"])
async def test_a_script_refusing_its_arguments_rejects_and_holds_nothing(
    redis: RespBackend, policy: str
) -> None:
    settings = attrs.evolve(CHECK, rate_limits_policy=policy, budgets_policy=policy)
    local = LocalGovernance()
    identity = who(Limits(rpm=3, max_parallel=1, max_budget_nanousd=10**9))
    with trio.fail_after(10):
        for i in range(6):
            b, r = await check(redis, identity, facts(f"r{i}", cost=HUGE, tokens=HUGE),
                               settings=settings, local=local)
            assert isinstance(r.decision, Rejected) and r.decision.status == 500
            assert r.decision.reason == "check_failed" and not r.decision.degraded
            assert isinstance(b.decision, Rejected) and b.decision.status == 500
        # Nothing was counted: the window and the parallel slots are empty.
        key = rate_window_key("key", KEY_ID, PARALLEL)
        assert await redis.execute([("ZCARD", key)]) == [0]


def test_refusals_and_outages_are_told_apart() -> None:
    assert is_refusal(CommandError("ERR rate_admit: expected now_ms, request_id, ..."))
    assert not is_refusal(CommandError("BUSY Redis is busy running a script"))
    assert not is_refusal(CommandError("LOADING Redis is loading the dataset in memory"))
    assert not is_refusal(BackendUnavailable("counters", "connection refused"))
