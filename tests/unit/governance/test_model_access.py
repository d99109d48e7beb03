"""``models`` lists and model aliases: the pure rules the identity check applies."""

from __future__ import annotations

import pytest

from triogate.governance.model_access import model_allowed, resolve_alias
from triogate.governance.principals import Identity, Principal


def openai() -> frozenset[str]:
    return frozenset({"openai"})


@pytest.mark.parametrize(("models", "group", "allowed"), [
    ((), "gpt-test", True),
    (("*",), "anything", True),
    (("gpt-test",), "gpt-test", True),
    (("gpt-test",), "claude-test", False),
    (("openai/*",), "gpt-test", True),                 # by the deployment's provider
    (("anthropic/*",), "gpt-test", False),
    (("anthropic/*",), "anthropic/claude-3", True),    # by the group name's prefix
    (("later-model",), "gpt-test", False),             # stored, effective once served
    (("all-team-models",), "gpt-test", False),         # no team: nothing
])
def test_models_lists(models: tuple[str, ...], group: str, allowed: bool) -> None:
    assert model_allowed(models, group, providers=openai) is allowed


def test_labels_are_looked_up_at_most_once_and_never_for_a_direct_match() -> None:
    def boom() -> frozenset[str]:
        raise AssertionError("looked up")

    assert model_allowed(("gpt-test", "*"), "x", providers=boom)
    assert model_allowed(("a", "x"), "x", providers=boom)
    calls: list[int] = []

    def counted() -> frozenset[str]:
        calls.append(1)
        return frozenset({"openai", "access_group:beta"})

    assert not model_allowed(("a", "b", "anthropic/*"), "x", providers=counted)
    assert model_allowed(("a", "beta"), "x", providers=counted)
    assert calls == [1, 1]


@pytest.mark.parametrize(("models", "allowed"), [
    (("beta",), True), (("gamma",), False), (("openai/*",), True),
])
def test_access_groups_come_from_the_labels(models: tuple[str, ...], allowed: bool) -> None:
    def labels() -> frozenset[str]:
        return frozenset({"openai", "access_group:beta"})

    assert model_allowed(models, "gpt-test", providers=labels) is allowed


@pytest.mark.parametrize(("team_models", "group", "allowed"), [
    ((), "gpt-test", True),                  # a team with every model
    (("claude-test",), "claude-test", True),
    (("claude-test",), "gpt-test", False),
    (("openai/*",), "gpt-test", True),
])
def test_all_team_models_means_the_team_list(team_models: tuple[str, ...], group: str,
                                             allowed: bool) -> None:
    identity = Identity(key=Principal(kind="key", id="k", models=("all-team-models",)),
                        team=Principal(kind="team", id="t", models=team_models))
    refusing = identity.first_refusing(group, providers=openai)
    assert (refusing is None) is allowed


def test_the_team_list_still_binds_a_key_with_its_own_list() -> None:
    identity = Identity(key=Principal(kind="key", id="k", models=("*",)),
                        team=Principal(kind="team", id="t", models=("claude-test",)))
    refusing = identity.first_refusing("gpt-test")
    assert refusing is not None and refusing.kind == "team"


def test_aliases_resolve_one_hop_most_specific_first() -> None:
    key = {"mistral-7b": "gpt-3.5-turbo"}
    team = {"mistral-7b": "claude", "fast": "gpt-4o-mini"}
    config = {"fast": "other", "gpt-3.5-turbo": "never-followed"}
    assert resolve_alias("mistral-7b", key, team, config) == "gpt-3.5-turbo"
    assert resolve_alias("fast", key, team, config) == "gpt-4o-mini"
    assert resolve_alias("plain", key, None, config) == "plain"
