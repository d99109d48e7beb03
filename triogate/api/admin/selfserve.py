"""What a caller who is not a proxy admin may put in a key (LiteLLM's self-service).

* An ``internal_user`` creates and changes keys of its own (``user_id`` = itself; a team
  only if it belongs to it), with ``models`` its own user may use and a ``max_budget``
  no larger than its own. The request path enforces the user's limits anyway; these
  checks refuse, up front, a key that promises more than it could ever get.
* A team admin creates and changes its team's keys, for itself, a member, or no user.
* Either may put on a key (``tags``, ``metadata.tags``) a tag with a budget or limits
  only if its own key or its team, or the key's team, already has that tag: a request
  may name such a tag only from a key that carries it (``identity.allowed_tags``), so a
  key that could carry any would let its holder spend another team's tag budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api.admin.common import sql
from triogate.api.admin.roles import INTERNAL, forbidden
from triogate.governance.from_rows import tag_principal
from triogate.governance.identity import governed
from triogate.governance.model_access import model_allowed

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from triogate.api.admin.roles import Caller
    from triogate.store import KeyRow, Store


async def check_key_write(caller: Caller, store: Store, fields: dict[str, Any],
                          row: KeyRow | None = None) -> dict[str, Any]:
    """``fields`` (completed with ``user_id`` for a self-service key), or 403. A checkpoint.

    Args:
        row: the key being changed (None when creating one).
    """
    if caller.is_admin:
        return fields
    team_id = fields.get("team_id", row.team_id if row else None)
    user_id = fields.get("user_id", row.user_id if row else None)
    await _check_tags(caller, store, fields, row, team_id)
    if team_id is not None and team_id in caller.admin_of:
        if user_id is not None and user_id != caller.user_id:
            with sql(f"list the members of team '{team_id}'"):
                members = (await store.team_members([team_id]))[team_id]
            if user_id not in {m.user_id for m in members}:
                raise forbidden(f"give a key of team '{team_id}' to '{user_id}', who is not "
                                "a member of it")
        return fields
    if caller.role != INTERNAL or caller.user is None:
        raise forbidden("create or change this key")
    if row is None and user_id is None:
        fields = {**fields, "user_id": caller.user_id}
    elif user_id != caller.user_id:
        raise forbidden("create or change keys of another user")
    if team_id is not None and team_id not in caller.member_of:
        raise forbidden(f"use team '{team_id}', which you do not belong to")
    user = caller.user
    if user.models and "models" in fields:
        wanted = fields["models"] or ("*",)
        too_wide = [m for m in wanted if m != "all-team-models"
                    and not model_allowed(user.models, m)]
        if too_wide:
            raise forbidden(f"give a key models your user may not use: {', '.join(too_wide)}")
    limit = user.max_budget_nanousd
    if limit is not None and "max_budget_nanousd" in fields and (
            fields["max_budget_nanousd"] is None or fields["max_budget_nanousd"] > limit):
        raise forbidden("give a key a larger budget than your own")
    return fields


async def _check_tags(caller: Caller, store: Store, fields: dict[str, Any],
                      row: KeyRow | None, team_id: str | None) -> None:
    """403 when ``fields`` put on the key a tag with a budget or limits that neither the
    caller's own key or team, nor the key's team, has (tags the key already had stay).
    A checkpoint when the key gets new tags."""
    wanted = _key_tags(fields.get("tags", ()), fields.get("metadata"))
    if row is not None:
        wanted -= _key_tags(row.tags, row.metadata)
    if not wanted:
        return
    with sql("look up tags"):
        found = await store.get_tags(sorted(wanted))
        budgeted = {t for t, r in found.items() if governed(tag_principal(r))}
        if not budgeted:
            return
        own = await store.get_keys([caller.key_hash]) if caller.key_hash else {}
        team_ids = [t for t in (team_id, caller.team_id) if t is not None]
        teams = await store.get_teams(team_ids) if team_ids else {}
    mine: set[str] = set()
    for key in own.values():
        mine |= _key_tags(key.tags, key.metadata)
    for team in teams.values():
        mine |= _key_tags((), team.metadata)
    refused = sorted(budgeted - mine)
    if refused:
        raise forbidden(f"put on a key tags with a budget or limits that your key or team "
                        f"does not have: {', '.join(refused)}")


def _key_tags(tags: Iterable[Any], metadata: Mapping[str, Any] | None) -> set[str]:
    """A key's tags: its ``tags`` and its (or its team's) ``metadata.tags``."""
    out = {t for t in tags if isinstance(t, str)}
    meta_tags = (metadata or {}).get("tags")
    if isinstance(meta_tags, list):
        out |= {t for t in meta_tags if isinstance(t, str)}
    return out
