"""Routing's errors (a leaf module: cooldowns, retries and the router raise them)."""

from __future__ import annotations

from triogate.errors import TriogateError


class NoDeploymentAvailable(TriogateError):
    """Raised by ``Router.run`` when no deployment of a group (nor of its fallbacks) may be
    called: all cool down, or all are at their RPM/TPM limit this minute.

    Attributes:
        group: the model group the request asked for.
        retry_after_s: when one should become available again (seconds, >= 0).
        reason: ``"cooldown"`` (every candidate cools down) or ``"limits"`` (some are
            only over their RPM/TPM limit this minute); the gateway maps the first to 503
            and the second to 429, or both to 429.
    """

    def __init__(self, group: str, retry_after_s: float, *, reason: str = "cooldown") -> None:
        super().__init__(
            f"no deployment available for model group {group!r} ({reason}); "
            f"retry after {retry_after_s:.1f}s"
        )
        self.group = group
        self.retry_after_s = retry_after_s
        self.reason = reason
