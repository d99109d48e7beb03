"""The live use of a principal's rate windows, read as ``rate_admit.lua`` counts them.

One pipeline: the RPM and TPM windows are hashes of one-second buckets (the last 60
count), the parallel window a sorted set of slots scored by lease expiry (live when the
score is in the future). Read-only: the dashboard never writes a window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

from triogate.batch import BackendUnavailable
from triogate.governance.keys import PARALLEL, RPM, TPM, rate_window_key

if TYPE_CHECKING:
    from triogate.api.services import Services

#: The dashboard's kinds → the governance principal kinds.
PRINCIPAL_KINDS = {"keys": "key", "teams": "team", "users": "user", "customers": "end_user",
                   "tags": "tag"}
BUCKETS = 60


@final
@attrs.frozen(kw_only=True)
class LiveUse:
    """Requests and tokens in the last minute, parallel requests now (None: unknown)."""

    rpm: int | None = None
    tpm: int | None = None
    parallel: int | None = None


def window_sum(reply: object, now_ms: int) -> int | None:
    """The sum of an HGETALL of buckets over the last 60 s (as the admit script counts)."""
    if not isinstance(reply, list):
        return None
    oldest = now_ms // 1000 - BUCKETS
    total = 0
    for bucket, count in zip(reply[::2], reply[1::2], strict=False):
        try:
            if int(bucket) > oldest:
                total += int(count)
        except (TypeError, ValueError):
            continue
    return total


async def live_use(services: Services, kind: str, principal_id: str) -> LiveUse:
    """The principal's windows now; all None when Redis does not answer. A checkpoint."""
    pk = PRINCIPAL_KINDS[kind]
    now_ms = services.clock_ms()
    commands = [
        ("HGETALL", rate_window_key(pk, principal_id, RPM)),
        ("HGETALL", rate_window_key(pk, principal_id, TPM)),
        ("ZCOUNT", rate_window_key(pk, principal_id, PARALLEL), f"({now_ms}", "+inf"),
    ]
    try:
        rpm, tpm, parallel = await services.backends[services.checks.backend].execute(commands)
    except BackendUnavailable:
        return LiveUse()
    return LiveUse(rpm=window_sum(rpm, now_ms), tpm=window_sum(tpm, now_ms),
                   parallel=parallel if isinstance(parallel, int) else None)
