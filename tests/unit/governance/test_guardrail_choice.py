"""Which guardrails run for a request, its key and its team (LiteLLM's rule), as pure
functions: no gateway, no I/O."""

from __future__ import annotations

import re

from triogate.config_governance import CONTENT_FILTER, GuardrailSpec, Pattern
from triogate.governance.from_rows import guardrail_settings
from triogate.governance.guardrails import Guardrails
from triogate.governance.principals import Identity, Principal


def spec(name: str, *, default_on: bool, modes: tuple[str, ...] = ("pre_call",)
         ) -> GuardrailSpec:
    rule = Pattern(name=name, regex=re.compile(name), action="BLOCK")
    return GuardrailSpec(name=name, kind=CONTENT_FILTER, modes=modes,
                         default_on=default_on, patterns=(rule,))


GUARDS = Guardrails([spec("always", default_on=True, modes=("pre_call", "post_call")),
                     spec("pii", default_on=False), spec("deny", default_on=False)], None)


def names(mode: str, requested: tuple[str, ...], *, off: bool = False) -> list[str]:
    return [g.name for g in GUARDS.active(mode, requested, global_off=off)]


def test_default_on_ones_run_and_named_ones_join_them_in_config_order() -> None:
    assert names("pre_call", ()) == ["always"]
    assert names("pre_call", ("deny", "pii")) == ["always", "pii", "deny"]
    assert names("post_call", ("pii",)) == ["always"]  # pii has no post_call mode


def test_global_off_skips_default_on_ones_even_when_named() -> None:
    assert names("pre_call", ("pii", "always"), off=True) == ["pii"]
    assert names("post_call", (), off=True) == []


def test_metadata_gives_the_principals_settings_and_ignores_junk() -> None:
    assert guardrail_settings({"guardrails": ["pii", "pii", 3, "deny"],
                               "disable_global_guardrails": True}) == {
        "guardrails": ("pii", "deny"), "disable_global_guardrails": True}
    assert guardrail_settings({"guardrails": "pii", "disable_global_guardrails": "yes"}) == {
        "guardrails": (), "disable_global_guardrails": None}
    assert guardrail_settings(None) == {"guardrails": (), "disable_global_guardrails": None}


def who(key: dict[str, object], team: dict[str, object] | None = None) -> Identity:
    return Identity(
        key=Principal(kind="key", id="k", **key),  # type: ignore[arg-type]
        team=Principal(kind="team", id="t", **team) if team is not None  # type: ignore[arg-type]
        else None)


def test_key_and_team_lists_add_up_and_the_keys_flag_wins() -> None:
    assert who({"guardrails": ("pii",)}, {"guardrails": ("deny", "pii")}).guardrails() == (
        ("pii", "deny"), False)
    assert who({}, {"disable_global_guardrails": True}).guardrails() == ((), True)
    assert who({"disable_global_guardrails": False},
               {"disable_global_guardrails": True}).guardrails() == ((), False)
    assert who({"disable_global_guardrails": True}).guardrails() == ((), True)
    assert who({}).guardrails() == ((), False)
