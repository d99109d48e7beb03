"""The admin API's guardrail fields: kept in metadata, checked against the config, and
LiteLLM's rule that only proxy admins turn the default-on guardrails off."""

from __future__ import annotations

from typing import Any

import pytest

from triogate.api.admin.converters import FieldContext
from triogate.api.admin.fields import KEY_FIELDS, TEAM_FIELDS, parse_fields
from triogate.api.admin.guardrail_fields import fold
from triogate.api.errors import ApiError

CTX = FieldContext(groups=frozenset({"gpt-test"}), now_ms=0)
CONFIGURED = frozenset({"pii", "deny"})


def folded(body: dict[str, Any], current: dict[str, Any] | None = None, *,
           admin: bool = True) -> dict[str, Any]:
    fields = parse_fields(body, KEY_FIELDS, CTX)
    return fold(fields, current, configured=CONFIGURED, admin=admin, entity="key")


def test_top_level_fields_land_in_metadata_keeping_the_rest() -> None:
    assert folded({"guardrails": ["pii", "pii"], "disable_global_guardrails": True},
                  {"note": "x"}) == {"metadata": {
                      "note": "x", "guardrails": ["pii"], "disable_global_guardrails": True}}
    assert folded({"guardrails": None}, {"guardrails": ["pii"], "note": "x"}) == {
        "metadata": {"note": "x"}}
    assert folded({"guardrails": []}, {"guardrails": ["pii"]}) == {"metadata": {}}
    # A new metadata replaces the old one; top-level fields still apply on top of it.
    assert folded({"metadata": {"a": 1}, "guardrails": ["deny"]}, {"guardrails": ["pii"]}
                  ) == {"metadata": {"a": 1, "guardrails": ["deny"]}}
    assert folded({"key_alias": "k"}, {"guardrails": ["pii"]}) == {"key_alias": "k"}


@pytest.mark.parametrize(("body", "param"), [
    ({"guardrails": ["nosuch"]}, "guardrails"),
    ({"metadata": {"guardrails": ["pii", "nosuch"]}}, "guardrails"),
    ({"guardrails": "pii"}, "guardrails"),
    ({"disable_global_guardrails": "yes"}, "disable_global_guardrails"),
    ({"metadata": {"disable_global_guardrails": 1}}, "metadata.disable_global_guardrails"),
    ({"metadata": {"opted_out_global_guardrails": ["pii"]}}, "opted_out_global_guardrails"),
])
def test_what_triogate_would_not_act_on_is_a_400_naming_it(
        body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        folded(body)
    assert caught.value.status == 400 and caught.value.param == param


def test_only_admins_turn_default_on_guardrails_off_unless_already_off() -> None:
    for body in ({"disable_global_guardrails": True},
                 {"metadata": {"disable_global_guardrails": True}}):
        with pytest.raises(ApiError) as caught:
            folded(body, admin=False)
        assert caught.value.status == 403
    assert folded({"disable_global_guardrails": False}, admin=False) == {
        "metadata": {"disable_global_guardrails": False}}
    already = {"disable_global_guardrails": True}
    assert folded({"guardrails": ["pii"]}, already, admin=False)["metadata"] == {
        "disable_global_guardrails": True, "guardrails": ["pii"]}


def test_teams_take_the_fields_too() -> None:
    fields = parse_fields({"guardrails": ["deny"], "disable_global_guardrails": True},
                          TEAM_FIELDS, CTX)
    assert fold(fields, None, configured=CONFIGURED, admin=True, entity="team") == {
        "metadata": {"guardrails": ["deny"], "disable_global_guardrails": True}}
