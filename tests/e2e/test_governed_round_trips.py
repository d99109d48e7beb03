"""The I/O budget with governance on: key, team and end-user budgets, TPM/RPM limits and
usage-based routing cost ONE wait before the model call and one after, with the
identity in memory; at most three in all when it must be refreshed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.e2e.conftest import BOTH_SERVERS, gateway_config, running_gateway, traced_waits

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend, TraceSummary
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e, BOTH_SERVERS]

USD = 1_000_000_000


@pytest.fixture
async def governed(tmp_path: Path, redis: RespBackend, redis_url: str,
                   upstream: FakeUpstream, server: str) -> AsyncIterator[tuple[Gateway, str]]:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            router_settings={"routing_strategy": "usage-based-routing"})
    with trio.fail_after(60):
        async with running_gateway(config, server=server) as gateway:
            store = gateway.services.store
            assert store is not None
            team = await store.create_team(team_alias="ml", max_budget_nanousd=100 * USD,
                                           budget_duration="30d", tpm_limit=1_000_000,
                                           rpm_limit=1000)
            raw, _ = await store.create_key(team_id=team.team_id, max_budget_nanousd=10 * USD,
                                            budget_duration="1d", tpm_limit=100_000,
                                            rpm_limit=100)
            await store.create_end_user(user_id="customer-1", max_budget_nanousd=1 * USD,
                                        rpm_limit=50)
            yield gateway, raw


async def traced(gateway: Gateway, key: str, **extra: object) -> TraceSummary:
    body = {"model": "gpt-test", "user": "customer-1",
            "messages": [{"role": "user", "content": "count my waits"}], **extra}
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{gateway.openai_base}/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    with trio.fail_after(10):
        await gateway.drained()
    assert gateway.services.tracer is not None
    return gateway.services.tracer.summary(response.headers["x-triogate-trace-id"])


async def test_identity_in_memory_waits_once_before_and_once_after(
    governed: tuple[Gateway, str],
) -> None:
    gateway, key = governed
    await traced(gateway, key)  # warms the identity
    summary = await traced(gateway, key)
    assert (summary.waits_before, summary.waits_after) == (1, 1)
    (before,) = [r for r in summary.records if r.phase == "before"]
    owners = sorted(before.owners)
    # One script per principal: key, team and end user each have a budget and rate
    # limits, checked by one budget_reserve.lua call (governance/admit.py); one routing
    # read; nothing for auth.
    assert owners == sorted(["budgets"] * 3 + ["routing"])
    (after,) = [r for r in summary.records if r.phase == "after"]
    # After: one script per principal. The key's and the team's rate windows ride with
    # their budget settlement (governance/settle.py); the end user's RPM window has nothing
    # to settle after an admitted request (its count stands).
    assert sorted(after.owners) == sorted(["budgets"] * 3 + ["routing"])


async def test_a_streamed_request_has_the_same_budget(governed: tuple[Gateway, str]) -> None:
    gateway, key = governed
    await traced(gateway, key)
    summary = await traced(gateway, key, stream=True)
    assert (summary.waits_before, summary.waits_after) == (1, 1)


async def test_a_cold_or_refreshed_identity_waits_at_most_three_times(
    governed: tuple[Gateway, str],
) -> None:
    gateway, key = governed
    identities = gateway.services.identities
    assert identities is not None
    cold = await traced(gateway, key)  # never seen: MGET misses, SQL, write-back
    assert cold.waits <= 3
    assert cold.waits_before == 2
    loads = identities.sql_loads
    identities.expire()  # what 60 s would do; rows stay as hints
    refreshed = await traced(gateway, key)
    assert refreshed.waits <= 3
    assert (refreshed.waits_before, refreshed.waits_after) == (2, 1)
    assert identities.sql_loads == loads  # Redis had the rows: no SQL this time
    first = [r for r in refreshed.records if r.phase == "before" and r.round == 1]
    assert "auth" in {o for r in first for o in r.owners}


@pytest.mark.parametrize(("path", "body"), [
    ("/chat/completions", {"model": "gpt-test"}),
    ("/v1/completions", {"model": "gpt-test", "prompt": "hi"}),
    ("/completions", {"model": "claude-test", "prompt": "hi", "stream": True}),
    ("/embeddings", {"model": "embed-test", "input": "hi"}),
    ("/responses", {"model": "gpt-test", "input": "hi"}),
    ("/messages", {"model": "claude-test", "max_tokens": 16,
                   "metadata": {"user_id": "customer-1"}}),  # Anthropic's end user
    ("/openai/deployments/gpt-test/chat/completions?api-version=2024-06-01", {}),
])
async def test_every_litellm_route_with_a_governed_key_waits_once_before_and_after(
    governed: tuple[Gateway, str], path: str, body: dict[str, object],
) -> None:
    gateway, key = governed
    await traced(gateway, key)  # warms the identity
    messages = [{"role": "user", "content": "count my waits"}]
    if "prompt" not in body and "input" not in body:
        body = {**body, "messages": messages}
    async with httpx.AsyncClient(timeout=20) as http:
        end_user = {} if path == "/messages" else {"user": "customer-1"}
        response = await http.post(f"{gateway.url}{path}", json={**body, **end_user},
                                   headers={"authorization": f"Bearer {key}"})
    summary = await traced_waits(gateway, response)
    assert (summary.waits_before, summary.waits_after) == (1, 1)
    (before,) = [r for r in summary.records if r.phase == "before"]
    assert sorted(before.owners) == sorted(["budgets"] * 3 + ["routing"])


async def _fail_in_admission(gateway: Gateway, key: str, monkeypatch: pytest.MonkeyPatch,
                             part: str) -> None:
    """One request whose ``part`` (``budgets`` or ``rate_limits``) of the admission fails
    with a bug: a 500; then the settler has drained."""
    async def broken(*args: object, **kwargs: object) -> object:
        await trio.lowlevel.checkpoint()
        raise RuntimeError(f"a bug in the {part}")

    monkeypatch.setattr(f"triogate.governance.{part}.conclude", broken)
    body = {"model": "gpt-test", "user": "customer-1",
            "messages": [{"role": "user", "content": "fail in admission"}]}
    async with httpx.AsyncClient(timeout=20) as http:
        response = await http.post(f"{gateway.openai_base}/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 500
    with trio.fail_after(10):
        await gateway.drained()


async def test_a_failing_check_leaves_no_reservation_of_the_other(
    governed: tuple[Gateway, str], redis: RespBackend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Budgets and rate limits share one script per principal but stay two participants:
    when the rate limits' part fails unexpectedly (a bug), the budgets' reservations made
    by the same calls are undone, as when they were two scripts."""
    gateway, key = governed
    await traced(gateway, key)  # warms the identity

    await _fail_in_admission(gateway, key, monkeypatch, "rate_limits")
    (names,) = await redis.execute([("KEYS", "tg:*:bud:*")])  # type: ignore[list-item]
    assert isinstance(names, list)
    counters = [n.decode() for n in names
                if not n.decode().endswith((":res", ":exp")) and ":done:" not in n.decode()]
    assert len(counters) == 3  # key, team, end user
    replies = await redis.execute([("HGET", c, "reserved") for c in counters])
    assert [int(r) for r in replies] == [0, 0, 0]  # type: ignore[call-overload]


async def rate_counts(redis: RespBackend) -> dict[str, int]:
    """Every rate window's total (requests, tokens, parallel slots) by key."""
    (names,) = await redis.execute([("KEYS", "tg:*:rl:*")])  # type: ignore[list-item]
    assert isinstance(names, list)
    windows = sorted(n.decode() for n in names if ":done:" not in n.decode())
    replies = await redis.execute(
        [("ZCARD", w) if w.endswith(":par") else ("HGETALL", w) for w in windows])
    counts: dict[str, int] = {}
    for window, reply in zip(windows, replies, strict=True):
        if isinstance(reply, int):
            counts[window] = reply
        else:  # bucket (an epoch second), count, ...; `t` their sum, `o` the low-water
            # second (moves on with the clock at every admission), `~` padding
            assert isinstance(reply, list)
            fields = dict(zip(reply[::2], reply[1::2], strict=True))
            buckets = sum(int(v) for f, v in fields.items() if f.isdigit())
            assert int(fields.get(b"t", buckets)) == buckets, fields  # the running total
            counts[window] = buckets
    return counts


async def test_a_failing_budget_check_leaves_no_count_of_the_rate_limits(
    governed: tuple[Gateway, str], redis: RespBackend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other direction: both parts are read in the request's own task, one after the
    other; when the budgets' part fails first, the rate limits' part is still read, and
    what their windows counted is undone."""
    gateway, key = governed
    await traced(gateway, key)  # warms the identity
    with trio.fail_after(10):
        await gateway.drained()
    before = await rate_counts(redis)
    assert any(before.values())  # the warm-up request was counted
    await trio.sleep(1.1)

    await _fail_in_admission(gateway, key, monkeypatch, "budgets")
    assert await rate_counts(redis) == before


async def test_proxy_budget_model_budget_and_pre_call_guardrail_still_wait_once_each(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream, server: str,
) -> None:
    guardrail = {"guardrail_name": "pii", "litellm_params": {
        "guardrail": "litellm_content_filter", "mode": "pre_call", "default_on": True,
        "patterns": [{"pattern_type": "prebuilt", "pattern_name": "email", "action": "MASK"}],
        "blocked_words": [{"keyword": "forbidden", "action": "BLOCK"}]}}
    config = gateway_config(
        tmp_path / "state", redis_url, upstream.base_url,
        router_settings={"routing_strategy": "usage-based-routing"},
        litellm_settings={"max_budget": 1000, "budget_duration": "30d"},
        guardrails=[guardrail])
    with trio.fail_after(60):
        async with running_gateway(config, server=server) as gateway:
            store = gateway.services.store
            assert store is not None
            team = await store.create_team(team_alias="ml", max_budget_nanousd=100 * USD,
                                           rpm_limit=1000)
            key, _ = await store.create_key(
                team_id=team.team_id, max_budget_nanousd=10 * USD, rpm_limit=100,
                model_max_budget={"gpt-test": {"budget_limit_nanousd": 5 * USD,
                                               "time_period": "1d"}})
            await store.create_end_user(user_id="customer-1", max_budget_nanousd=1 * USD)
            await traced(gateway, key)  # warms the identity
            summary = await traced(gateway, key, messages=[
                {"role": "user", "content": "mail ada@example.com"}])
    assert (summary.waits_before, summary.waits_after) == (1, 1)
    (before,) = [r for r in summary.records if r.phase == "before"]
    # Key, team, end user, the key's budget for gpt-test and the proxy's: five scripts
    # of one round; the guardrail declares nothing.
    assert sorted(before.owners) == sorted(["budgets"] * 5 + ["routing"])
    assert upstream.requests[-1].json["messages"][0]["content"] == "mail [EMAIL_REDACTED]"
    (after,) = [r for r in summary.records if r.phase == "after"]
    assert sorted(after.owners) == sorted(["budgets"] * 5 + ["routing"])


async def test_a_key_and_team_naming_guardrails_still_wait_once_before_and_after(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream, server: str,
) -> None:
    # Off by default: they run because the key and its team name them in their metadata,
    # which the identity in memory already holds (no further read).
    pii = {"guardrail_name": "pii", "litellm_params": {
        "guardrail": "litellm_content_filter", "mode": "pre_call", "default_on": False,
        "patterns": [{"pattern_type": "prebuilt", "pattern_name": "email", "action": "MASK"}]}}
    deny = {"guardrail_name": "deny", "litellm_params": {
        "guardrail": "litellm_content_filter", "mode": "pre_call", "default_on": False,
        "blocked_words": [{"keyword": "forbidden", "action": "BLOCK"}]}}
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            router_settings={"routing_strategy": "usage-based-routing"},
                            guardrails=[pii, deny])
    with trio.fail_after(60):
        async with running_gateway(config, server=server) as gateway:
            store = gateway.services.store
            assert store is not None
            team = await store.create_team(team_alias="ml", max_budget_nanousd=100 * USD,
                                           metadata={"guardrails": ["deny"]})
            key, _ = await store.create_key(team_id=team.team_id, rpm_limit=100,
                                            max_budget_nanousd=10 * USD,
                                            metadata={"guardrails": ["pii"]})
            await store.create_end_user(user_id="customer-1", max_budget_nanousd=1 * USD)
            await traced(gateway, key)  # warms the identity
            summary = await traced(gateway, key, messages=[
                {"role": "user", "content": "mail ada@example.com"}])
    assert (summary.waits_before, summary.waits_after) == (1, 1)
    assert upstream.requests[-1].json["messages"][0]["content"] == "mail [EMAIL_REDACTED]"
    (before,) = [r for r in summary.records if r.phase == "before"]
    assert sorted(before.owners) == sorted(["budgets"] * 3 + ["routing"])
