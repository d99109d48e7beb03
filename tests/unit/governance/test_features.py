"""The governance features' pure parts: their settings, the content filter, the texts a
guardrail reads, alert thresholds and payloads, and the budget-only principals."""

from __future__ import annotations

from typing import Any

import pytest

from triogate.api.guarding import request_slots, response_slots
from triogate.config_governance import governance_features
from triogate.errors import ConfigError
from triogate.governance.alerts import Alert, crossed
from triogate.governance.budgets import BudgetHold, budgeted
from triogate.governance.facts import CheckSettings, RequestFacts
from triogate.governance.guardrails import BLOCKED, MASKED, PASSED, content_filter
from triogate.governance.principals import Identity, Limits, Principal


def features(**overrides: Any) -> Any:
    args: dict[str, Any] = {"max_budget": None, "budget_duration": None, "alerting": [],
                            "webhook_url": None, "guardrails": []}
    return governance_features(**{**args, **overrides})


def filter_spec(**params: Any) -> Any:
    spec = {"guardrail_name": "f", "litellm_params": {"guardrail": "litellm_content_filter",
                                                      **params}}
    return features(guardrails=[spec]).guardrails[0]


def test_proxy_budget_settings() -> None:
    made = features(max_budget="2.5", budget_duration="1mo")
    assert (made.proxy_max_budget_nanousd, made.proxy_budget_duration_s) == (
        2_500_000_000, 30 * 86_400)
    assert features(max_budget=0).proxy_max_budget_nanousd is None  # LiteLLM's "none"
    with pytest.raises(ConfigError, match=r"max_budget: must be a non-negative"):
        features(max_budget=-1)
    with pytest.raises(ConfigError, match=r"max_budget: not a number"):
        features(max_budget="ten")


@pytest.mark.parametrize(("entry", "message"), [
    ({"guardrail_name": "g", "litellm_params": {"guardrail": "aporia"}}, "is not built in"),
    ({"guardrail_name": "g", "litellm_params": {"guardrail": "litellm_content_filter",
                                                "mode": "sometimes"}}, "mode"),
    ({"guardrail_name": "g", "litellm_params": {"guardrail": "litellm_content_filter"}},
     "needs blocked_words or patterns"),
    ({"guardrail_name": "g", "litellm_params": {
        "guardrail": "litellm_content_filter",
        "patterns": [{"pattern_type": "prebuilt", "pattern_name": "ssn"}]}}, "pattern_name"),
    ({"guardrail_name": "g", "litellm_params": {
        "guardrail": "litellm_content_filter",
        "patterns": [{"pattern_type": "regex", "pattern": "("}]}}, "not a valid regex"),
    ({"guardrail_name": "g", "litellm_params": {
        "guardrail": "litellm_content_filter",
        "blocked_words": [{"keyword": "x", "action": "LOG"}]}}, "expected BLOCK or MASK"),
    ({"guardrail_name": "g", "litellm_params": {"guardrail": "generic_guardrail_api"}},
     "api_base: required"),
    ({"guardrail_name": "g", "litellm_params": {"guardrail": "generic_guardrail_api",
                                                "api_base": "http://x", "nope": 1}},
     "nope: unsupported key"),
    ({"litellm_params": {}}, "guardrail_name: required"),
])
def test_guardrail_settings_are_refused_with_their_path(entry: dict[str, Any],
                                                        message: str) -> None:
    with pytest.raises(ConfigError, match=r"\$\.guardrails\[0\]") as caught:
        features(guardrails=[entry])
    assert message in str(caught.value)


def test_two_guardrails_may_not_share_a_name() -> None:
    entry = {"guardrail_name": "g", "litellm_params": {
        "guardrail": "litellm_content_filter", "blocked_words": ["x"]}}
    with pytest.raises(ConfigError, match="used twice"):
        features(guardrails=[entry, entry])


def test_the_content_filter_masks_then_blocks() -> None:
    spec = filter_spec(mode=["pre_call", "post_call"], blocked_words=[
        {"keyword": "drop table", "action": "BLOCK"}], patterns=[
        {"pattern_type": "prebuilt", "pattern_name": "email", "action": "MASK"}])
    assert spec.modes == ("pre_call", "post_call")
    assert content_filter(spec, "pre_call", ["hello"]).status == PASSED
    masked = content_filter(spec, "pre_call", ["a@b.io and c@d.org", "none"])
    assert masked.status == MASKED
    assert masked.texts == ("[EMAIL_REDACTED] and [EMAIL_REDACTED]", "none")
    blocked = content_filter(spec, "pre_call", ["please DROP TABLE users"])
    assert blocked.status == BLOCKED and blocked.message == "content matched 'drop table'"
    # A keyword is a whole word: "dropped tables" is not "drop table".
    assert content_filter(spec, "pre_call", ["dropped tables"]).status == PASSED
    assert blocked.record() == {"guardrail_name": "f", "mode": "pre_call",
                                "status": "blocked", "message": "content matched 'drop table'"}


def test_the_texts_a_guardrail_reads_in_each_api() -> None:
    chat = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "text", "text": "t"}, {"type": "image_url", "image_url": {"url": "u"}}]}]}
    assert [c[k] for c, k in request_slots("chat", chat)] == ["s", "t"]
    messages = {"system": [{"type": "text", "text": "sys"}],
                "messages": [{"role": "user", "content": "hi"}]}
    assert [c[k] for c, k in request_slots("messages", messages)] == ["sys", "hi"]
    responses = {"instructions": "be brief", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]}]}
    assert [c[k] for c, k in request_slots("responses", responses)] == ["be brief", "q"]
    assert [c[k] for c, k in request_slots("responses", {"input": "q"})] == ["q"]
    assert [c[k] for c, k in request_slots("embeddings", {"input": ["a", [1, 2]]})] == ["a"]
    answer = {"choices": [{"message": {"content": "yes"}}, {"message": {"content": None}}]}
    assert [c[k] for c, k in response_slots("chat", answer)] == ["yes"]
    message = {"content": [{"type": "text", "text": "ok"}, {"type": "tool_use"}]}
    assert [c[k] for c, k in response_slots("messages", message)] == ["ok"]


def hold(**overrides: Any) -> BudgetHold:
    values: dict[str, Any] = {
        "kind": "key", "id": "k", "label": "k", "period": 0, "period_end_ms": None,
        "max_budget_nanousd": 1000, "amount_nanousd": 0, "settle_needed": True,
        "spend_nanousd": 0, "reserved_nanousd": 0, "soft_budget_nanousd": None}
    return BudgetHold(**{**values, **overrides})


def test_alert_thresholds() -> None:
    assert crossed(hold(), 499) == []
    assert crossed(hold(), 500) == ["50"]
    assert crossed(hold(), 850) == ["80"]
    assert crossed(hold(), 1000) == ["100"]
    assert crossed(hold(soft_budget_nanousd=100), 120) == ["soft"]
    assert crossed(hold(hard=False, soft_budget_nanousd=100, max_budget_nanousd=2**53 - 1),
                   10**12) == ["soft"]


def test_an_alert_payload_is_litellms_webhook_event_with_slacks_text() -> None:
    alert = Alert(kind="team_model", id="t1:gpt-4o", label="eng, model gpt-4o", period=3,
                  period_end_ms=None, threshold="80", spend_nanousd=8_000_000_000,
                  max_budget_nanousd=10_000_000_000, soft_budget_nanousd=None, at_ms=0)
    body = alert.payload()
    assert body["event"] == "threshold_crossed" and body["event_group"] == "team"
    assert body["team_id"] == "t1" and body["token"] is None
    assert body["event_message"] == "Team Budget: 80% Threshold Crossed"
    assert body["spend"] == 8.0 and body["max_budget"] == 10.0
    assert body["text"] == ("Team Budget: 80% Threshold Crossed: eng, model gpt-4o has spent "
                            "$8 of $10 in this period")
    assert alert.claim_key == "tg:{team_model:t1:gpt-4o}:alert:3:80"


def test_budget_only_principals() -> None:
    key = Principal(kind="key", id="h", alias="k", soft_budget_nanousd=5,
                    model_budgets={"gpt-4o": Limits(max_budget_nanousd=10)})
    team = Principal(kind="team", id="t", limits=Limits(rpm=5),
                     model_budgets={"claude": Limits(max_budget_nanousd=7)})
    identity = Identity(key=key, team=team)
    request = RequestFacts(request_id="r", model_group="gpt-4o", estimate_nanousd=1,
                           estimate_tokens=1, now_ms=0)
    settings = CheckSettings(proxy_limits=Limits(max_budget_nanousd=99))
    got = [(p.kind, p.id) for p in budgeted(identity, request, settings)]
    # The key (soft budget only), its budget for gpt-4o, the proxy; not the team (no
    # budget; its model budget is for another group).
    assert got == [("key", "h"), ("key_model", "h:gpt-4o"), ("proxy", "global")]
    assert budgeted(Identity(key=key, master=True), request, settings) == []


def test_model_and_soft_budgets_survive_the_identity_cache() -> None:
    from triogate.governance.identity import KeyBundle, decode_row, encode_row

    key = Principal(kind="key", id="h", soft_budget_nanousd=5, model_budgets={
        "gpt-4o": Limits(max_budget_nanousd=10, budget_duration_s=86_400)})
    bundle = KeyBundle(key=key)
    assert decode_row("key", encode_row(bundle)) == bundle
    # A row cached by a gateway without these fields reads as none set.
    old = decode_row("key", b'{"key": {"kind": "key", "id": "h"}}')
    assert isinstance(old, KeyBundle)
    assert old.key.model_budgets == {} and old.key.soft_budget_nanousd is None
