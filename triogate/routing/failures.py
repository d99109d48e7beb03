"""What an operator reads when a deployment fails: one warning per deployment per interval.

The request's own log line says how it ended (``error`` in ``api/settlement.py``); this
says which deployment failed and why, including the attempts that a retry or a fallback
made good, which no request line shows. A deployment failing at a thousand requests a
second must not write a thousand lines a second: after a warning, the deployment's next
failures within ``interval_ms`` are only counted, and the next warning says how many.
"""

from __future__ import annotations

import logging
from typing import final

logger = logging.getLogger("triogate.routing")

#: At most one warning per deployment this often.
INTERVAL_MS = 10_000
#: The most characters of an error's text a log line carries.
MAX_TEXT = 300


def describe(error: BaseException) -> str:
    """``ErrorClass: its text`` on one line, cut at :data:`MAX_TEXT` characters."""
    text = " ".join(str(error).split())
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@final
class FailureLog:
    """Warnings about failed attempts, at most one per deployment per ``interval_ms``."""

    def __init__(self, interval_ms: int = INTERVAL_MS) -> None:
        self._interval_ms = interval_ms
        #: deployment id -> (when its last warning was written, failures since).
        self._last: dict[str, tuple[int, int]] = {}

    def note(self, group: str, deployment_id: str, error: BaseException, *,
             now_ms: int) -> None:
        """A failed attempt of ``deployment_id`` (of ``group``) that counts against it."""
        last = self._last.get(deployment_id)
        if last is not None and now_ms - last[0] < self._interval_ms:
            self._last[deployment_id] = (last[0], last[1] + 1)
            return
        self._last[deployment_id] = (now_ms, 0)
        logger.warning(
            "deployment %s of %s failed: %s", deployment_id, group, describe(error),
            extra={"deployment": deployment_id, "model_group": group,
                   "error": describe(error),
                   "failures_not_logged": last[1] if last is not None else 0})
