"""Builders and a script-aware fake reply function for governance unit tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.governance import budgets, rate_limits
from triogate.governance.facts import CheckSettings, RequestFacts
from triogate.governance.principals import Identity, Limits, Principal

if TYPE_CHECKING:
    from collections.abc import Callable

    from triogate.batch.testing import RecordingBackend

NOW_MS = 1_790_000_000_000


def request(request_id: str = "req-1", *, estimate_nanousd: int = 1_000, estimate_tokens: int = 50,
            now_ms: int = NOW_MS, model_group: str = "gpt-4o") -> RequestFacts:
    return RequestFacts(request_id=request_id, model_group=model_group,
                        estimate_nanousd=estimate_nanousd, estimate_tokens=estimate_tokens,
                        now_ms=now_ms)


def identity(
    *,
    key: Limits | None = None,
    team: Limits | None = None,
    user: Limits | None = None,
    end_user: Limits | None = None,
    tags: tuple[Limits, ...] = (),
    model_rpm: dict[str, int] | None = None,
    model_tpm: dict[str, int] | None = None,
    master: bool = False,
) -> Identity:
    """An identity with the given principals (a key always), aliases for messages."""
    return Identity(
        key=Principal(kind="key", id="a" * 64, limits=key or Limits(), alias="sk-alias",
                      model_rpm=model_rpm or {}, model_tpm=model_tpm or {}),
        team=Principal(kind="team", id="ml", limits=team, alias="ml") if team else None,
        user=Principal(kind="user", id="u1", limits=user) if user else None,
        end_user=Principal(kind="end_user", id="cust-9", limits=end_user) if end_user else None,
        tags=tuple(Principal(kind="tag", id=f"tag{i}", limits=t) for i, t in enumerate(tags)),
        master=master,
    )


def settings(**changes: object) -> CheckSettings:
    return CheckSettings(**changes)  # type: ignore[arg-type]


def split(wire: tuple[object, ...]) -> tuple[str, list[str], list[str]]:
    """An EVALSHA wire command as (script name, keys, args), all as text."""
    sha = str(wire[1])
    names = {s.sha: s.name for s in (budgets.RESERVE, budgets.SETTLE, rate_limits.ADMIT,
                                       rate_limits.SETTLE)}
    n = int(wire[2])  # type: ignore[call-overload]
    text = [a.decode() if isinstance(a, bytes) else str(a) for a in wire[3:]]
    return names.get(sha, sha), text[:n], text[n:]


def scripted(
    *,
    over_budget: set[str] = frozenset(),  # type: ignore[assignment]
    spend: int = 0,
    rate_limited: set[str] = frozenset(),  # type: ignore[assignment]
    retry_after_ms: int = 12_000,
    get: object = b"cached",
) -> Callable[[tuple[object, ...]], object]:
    """A ``respond`` function for RecordingBackend that plays the governance scripts.

    ``over_budget`` and ``rate_limited`` name principal tags (``{team:ml}``) that refuse.
    Admitted rate windows report ``limit - 1`` remaining; refused ones ``0`` and fail on
    their first window.
    """

    def respond(wire: tuple[object, ...]) -> object:
        if str(wire[0]).upper() == "GET":
            return get
        name, keys, args = split(wire)
        tag = keys[0][keys[0].index("{"): keys[0].index("}") + 1]
        if name == "budget_reserve":
            budget = [0, spend, 0] if tag in over_budget else [1, spend, int(args[2])]
            if len(keys) == 3:
                return budget
            # With the principal's windows (governance/admit.py): rate_admit's reply after.
            return budget + rates(tag, [int(v) for v in args[8::2]])
        if name == "rate_admit":
            return rates(tag, [int(v) for v in args[5::2]])
        return 1

    def rates(tag: str, limits: list[int]) -> list[int]:
        if tag in rate_limited:
            return [0, 1, retry_after_ms, *([0] * len(limits))]
        return [1, 0, 0, *(lim - 1 for lim in limits)]

    return respond


def names(backend: RecordingBackend) -> list[list[str]]:
    """Per pipeline, each command as ``GET`` or the script's name."""
    return [
        [split(c)[0] if str(c[0]).upper() == "EVALSHA" else str(c[0]).upper() for c in p]
        for p in backend.pipelines
    ]
