"""Which model groups a principal may use, and what a model alias names. Pure functions.

A ``models`` list (on a key, a team or a user) is stored as the admin wrote it, and
matched against the requested group when a request arrives, so it may name groups
configured later. Its entries:

* empty list: every group (LiteLLM's default);
* ``"*"``: every group;
* ``"<provider>/*"`` (``"openai/*"``, ``"anthropic/*"``): every group that has a
  deployment of that provider, **or** whose own name starts with ``<provider>/`` (LiteLLM
  users name groups both ways: ``gpt-4o`` served by ``openai/gpt-4o``, and
  ``openai/gpt-4o`` as the group name itself);
* ``"all-team-models"``: whatever the key's team may use (nothing for a key without a
  team);
* an access group (LiteLLM's ``model_info.access_groups`` on a deployment): every group
  with a deployment in it;
* anything else: that group, exactly.

Aliases (a key's ``aliases``, a team's ``model_aliases``, the config's
``router_settings.model_group_alias``) map a requested name to a group, one hop:
:func:`resolve_alias` is the one place that rule lives, for the request path and for
access checks alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

ANY_MODEL = "*"
ALL_TEAM_MODELS = "all-team-models"
#: How an access group appears among a group's ``providers`` labels (see model_allowed).
ACCESS_GROUP = "access_group:"
_NO_PROVIDERS: frozenset[str] = frozenset()


def model_allowed(
    models: Iterable[str],
    group: str,
    *,
    providers: Callable[[], frozenset[str]] = lambda: _NO_PROVIDERS,
    team_models: Iterable[str] | None = None,
) -> bool:
    """Whether a ``models`` list admits ``group``.

    Args:
        models: the list as stored (empty = every group).
        group: the model group the request resolved to.
        providers: labels of ``group``'s deployments: their providers, and their access
            groups prefixed with :data:`ACCESS_GROUP`; called at most once, and not at
            all when the list names the group or ``*`` (so the common case costs nothing).
        team_models: the team's list, for ``all-team-models`` (None: no team).
    """
    entries = tuple(models)
    if not entries or group in entries or ANY_MODEL in entries:
        return True  # the common cases: no label lookup
    labels: frozenset[str] | None = None
    for entry in entries:
        if entry == ALL_TEAM_MODELS:
            if team_models is not None and model_allowed(team_models, group,
                                                         providers=providers):
                return True
            continue
        if entry.endswith("/*") and group.startswith(entry[:-1]):
            return True
        if labels is None:
            labels = providers()  # at most once
        if entry.endswith("/*"):
            if entry[:-2] in labels:
                return True
        elif ACCESS_GROUP + entry in labels:
            return True
    return False


def resolve_alias(model: str, *alias_maps: Mapping[str, str] | None) -> str:
    """The group ``model`` names: the first map that has it wins (one hop), else itself.

    Pass the maps most specific first: the key's ``aliases``, the team's
    ``model_aliases``, then the config's ``model_group_alias``.
    """
    for aliases in alias_maps:
        if aliases and model in aliases:
            return aliases[model]
    return model
