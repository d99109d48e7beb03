"""Who a request is: its key, team, user, end user and tags, with their limits.

Records only; resolving them (memory cache, one Redis MGET, SQL) is ``identity.py``.
Every limit is optional (None = unlimited). Money is in integer nano-USD.
"""

from __future__ import annotations

from collections.abc import Mapping  # noqa: TC003 (cattrs resolves field types at run time)
from typing import TYPE_CHECKING, final

import attrs

from triogate.governance.model_access import model_allowed

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

KINDS = ("key", "team", "user", "end_user", "tag", "team_member")
#: Budget-only principals: the proxy-wide budget, and a key's or a team's budget for one
#: model group (``model_max_budget``). Never in :meth:`Identity.principals` (they carry no
#: rate limits, model lists or blocks); ``governance.budgets.budgeted`` adds them.
PROXY, KEY_MODEL, TEAM_MODEL = "proxy", "key_model", "team_model"


@final
@attrs.frozen(kw_only=True)
class Limits:
    """Budget and rate limits of one principal.

    Attributes:
        max_budget_nanousd: spend allowed per budget period (nano-USD); None = no budget.
        budget_duration_s: length of a budget period; None = one period forever.
        budget_anchor_s: epoch second the periods count from (the principal's creation),
            so period ``n`` is ``[anchor + n·duration, anchor + (n+1)·duration)``.
        rpm: requests per minute (sliding window).
        tpm: tokens per minute (sliding window; reserved on an estimate, settled after).
        max_parallel: requests in flight at once.
    """

    max_budget_nanousd: int | None = None
    budget_duration_s: int | None = None
    budget_anchor_s: int = 0
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None

    def budget_period(self, now_ms: int) -> int:
        """Index of the budget period containing ``now_ms`` (0 when there is no duration)."""
        if not self.budget_duration_s:
            return 0
        return max(0, (now_ms // 1000 - self.budget_anchor_s) // self.budget_duration_s)

    def budget_period_end_ms(self, now_ms: int) -> int | None:
        """When the current period ends (epoch ms), or None for a lifetime budget."""
        if not self.budget_duration_s:
            return None
        period = self.budget_period(now_ms)
        return (self.budget_anchor_s + (period + 1) * self.budget_duration_s) * 1000


@final
@attrs.frozen(kw_only=True)
class Principal:
    """One party a request is accounted to.

    Attributes:
        kind: one of :data:`KINDS`.
        id: for a key, the SHA-256 of the key (the raw key is never kept); else its id.
        limits: its budget and rate limits.
        models: model groups it may use; empty = any.
        blocked: refuse every request.
        expires_ms: for keys, when the key stops working (epoch ms).
        model_rpm, model_tpm: for keys, per-model-group limits.
        alias: a display name (key alias, team alias, ...), for logs and reports.
        aliases: model aliases (a key's ``aliases``, a team's ``model_aliases``).
        role: for users, the LiteLLM role (``proxy_admin``, ``internal_user``, ...).
        soft_budget_nanousd: spend per budget period past which an alert is sent (the
            request is still served); None = no soft budget.
        model_budgets: for keys and teams, model group → its own budget
            (``model_max_budget``): ``max_budget_nanousd`` and ``budget_duration_s``.
        guardrails: for keys and teams, the guardrails its requests run besides the
            default-on ones (``metadata.guardrails``, as LiteLLM keeps them).
        disable_global_guardrails: for keys and teams, whether its requests skip the
            default-on guardrails (``metadata.disable_global_guardrails``); None = not set.
    """

    kind: str
    id: str
    limits: Limits = attrs.Factory(Limits)
    models: tuple[str, ...] = ()
    blocked: bool = False
    expires_ms: int | None = None
    model_rpm: Mapping[str, int] = attrs.Factory(dict)
    model_tpm: Mapping[str, int] = attrs.Factory(dict)
    alias: str | None = None
    aliases: Mapping[str, str] = attrs.Factory(dict)
    role: str | None = None
    soft_budget_nanousd: int | None = None
    model_budgets: Mapping[str, Limits] = attrs.Factory(dict)
    guardrails: tuple[str, ...] = ()
    disable_global_guardrails: bool | None = None

    def allows_model(
        self, group: str, *, providers: Callable[[], frozenset[str]] = lambda: frozenset(),
        team_models: tuple[str, ...] | None = None,
    ) -> bool:
        """Whether ``models`` admits ``group`` (see ``model_access.model_allowed``)."""
        return model_allowed(self.models, group, providers=providers, team_models=team_models)


@final
@attrs.frozen(kw_only=True)
class Identity:
    """The principals of one request. ``master`` requests skip governance."""

    key: Principal
    team: Principal | None = None
    user: Principal | None = None
    end_user: Principal | None = None
    tags: tuple[Principal, ...] = ()
    master: bool = False
    #: The user's limits inside the key's team (``max_budget_in_team``), if it has any.
    member: Principal | None = None

    def first_refusing(
        self, group: str, *, providers: Callable[[], frozenset[str]] = lambda: frozenset()
    ) -> Principal | None:
        """The key, team or user whose ``models`` refuses ``group`` (None: allowed).

        A key's ``all-team-models`` means its team's list.
        """
        team_models = self.team.models if self.team is not None else None
        if not self.key.allows_model(group, providers=providers, team_models=team_models):
            return self.key
        for party in (self.team, self.user):
            if party is not None and not party.allows_model(group, providers=providers):
                return party
        return None

    def guardrails(self) -> tuple[tuple[str, ...], bool]:
        """The guardrails the key and its team name (key's first, no repeats), and
        whether the default-on ones are off for its requests.

        LiteLLM's rule: the lists add up; ``disable_global_guardrails`` is the key's when
        the key sets it (true or false), else the team's.
        """
        team = self.team
        names = (*self.key.guardrails, *(team.guardrails if team is not None else ()))
        off = self.key.disable_global_guardrails
        if off is None and team is not None:
            off = team.disable_global_guardrails
        return tuple(dict.fromkeys(names)), bool(off)

    def principals(self) -> Iterator[Principal]:
        """Key, team, user, team member, end user, then tags: every party present, in
        that order."""
        yield self.key
        for p in (self.team, self.user, self.member, self.end_user):
            if p is not None:
                yield p
        yield from self.tags
