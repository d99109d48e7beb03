"""Decisions: what each check concludes, as values (rejections are not exceptions).

Each participant returns :class:`Allowed` or :class:`Rejected`. When several reject, the
client sees the first in a fixed order: auth, budget, rate limit, routing
(:func:`first_rejected`). ``api/errors.py`` renders a rejection in the API's own shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

#: The order in which rejections win.
ORDER = ("auth", "budgets", "rate_limits", "guardrails", "routing")


@final
@attrs.frozen(kw_only=True)
class Allowed:
    """The check passed.

    Attributes:
        headers: response headers the check contributes (e.g. remaining requests).
        degraded: the check could not reach Redis and decided from local state.
    """

    headers: Mapping[str, str] = attrs.Factory(dict)
    degraded: bool = False


@final
@attrs.frozen(kw_only=True)
class Rejected:
    """The check refused the request.

    Attributes:
        check: which check refused (one of :data:`ORDER`).
        reason: short machine label, e.g. ``"budget_exceeded"``.
        message: what the client is told.
        status: HTTP status.
        error_type: the error ``type`` in OpenAI's shape (``"budget_exceeded"``,
            ``"rate_limit_error"``, ``"authentication_error"``, ``"permission_error"``,
            ``"invalid_request_error"``, ``"service_unavailable"``).
        retry_after_s: for a ``Retry-After`` header, when known.
        headers: extra response headers.
        degraded: the refusal was made without Redis (fail-closed).
    """

    check: str
    reason: str
    message: str
    status: int
    error_type: str
    retry_after_s: float | None = None
    headers: Mapping[str, str] = attrs.Factory(dict)
    degraded: bool = False


Decision = Allowed | Rejected

def is_refusal(exc: BaseException) -> bool:
    """Whether a batch error is a script refusing its arguments (an ``ERR`` reply: the
    script's own argument check, or a runtime error in it), as opposed to Redis being
    unreachable, busy or loading, or holding a key of another type (``WRONGTYPE``), which
    the fail-open/fail-closed policies are for.

    A refusal must never turn into a fail-open decision: that would let a request that
    breaks a script pass every limit.
    """
    reply = getattr(exc, "reply", None)
    return isinstance(reply, str) and reply.startswith("ERR")


def check_failed(check: str) -> Rejected:
    """The rejection of a check whose script refused the request's arguments (a 500)."""
    return Rejected(
        check=check, reason="check_failed", status=500, error_type="api_error",
        message=f"the {check.replace('_', ' ')} check could not evaluate this request",
    )


def first_rejected(decisions: Iterable[Decision | None]) -> Rejected | None:
    """The rejection that wins: the first by :data:`ORDER` of its ``check``."""
    rejected = [d for d in decisions if isinstance(d, Rejected)]
    if not rejected:
        return None
    return min(rejected, key=lambda r: ORDER.index(r.check) if r.check in ORDER else len(ORDER))
