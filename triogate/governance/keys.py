"""Every Redis key of governance (budgets, rate limits), and the hash tags they live in.

Hash tags live here and nowhere else. Each principal has one tag, ``{<kind>:<id>}``, and
every key a script touches for that principal carries it, so one script call touches one
Redis Cluster slot. Keys of different principals are in different slots; that is why
budgets and rate limits make one script call *per principal*, all in the same round.

Layout (``T`` = the principal's tag)::

    tg:T:bud:<period>            HASH  spend, reserved            (nano-USD)
    tg:T:bud:<period>:res        HASH  request id -> reserved     (nano-USD)
    tg:T:bud:<period>:exp        ZSET  request id -> lease expiry (epoch ms)
    tg:T:bud:done:<slice>        HASH  request id -> 1: settlement markers (TTL); they also
                                       guard the rate windows a budget settlement carries
    tg:T:rl:rpm | rl:tpm         HASH  bucket (epoch s) -> requests | tokens
    tg:T:rl:rpm:m:<group>        HASH  the same, per model group
    tg:T:rl:tpm:m:<group>
    tg:T:rl:par                  ZSET  request id -> lease expiry (epoch ms)
    tg:T:rl:done:<slice>         HASH  request id -> 1: settlement markers (TTL)

The markers HASHes and the rate windows also hold a field ``~`` whose 72-byte value keeps
the server from storing them as listpacks (a listpack's field lookup is a scan: up to
128 fields on Redis 7, 512 on Valkey 8); readers skip it. Layouts written before it (no
``~``) are read the same, and get the field with their next marker or bucket.

Settlement markers are fields of one HASH per principal per minute (``<slice>`` =
epoch ms // :data:`MARKER_SLICE_MS` when the settlement was declared), not one key per
request: a field costs a few dozen bytes where a key with a TTL costs well over a
hundred, and Redis expires one hash per minute instead of one key per request. A minute,
not an hour: expiring a hash frees all its fields at once, and a minute of one busy
principal's markers frees in about a millisecond, an hour's would stall the server.

Identity rows share ONE tag, ``{id}``, so a single MGET can fetch every missing row of
a request (a key's bundle, its end user, its tags) even on Redis Cluster::

    tg:{id}:gen                  STRING generation, bumped by every admin change
    tg:{id}:key:<sha256>         STRING JSON bundle: the key, its team, its user
    tg:{id}:end_user:<id>        STRING JSON row (or a "missing" marker)
    tg:{id}:tag:<tag>            STRING JSON row (or a "missing" marker)
    tg:{id}:invalidate           pub/sub channel: "<kind>:<id>" or "*"
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import final

import attrs

PREFIX = "tg"
#: Ids longer than this (or containing braces) are hashed inside the tag.
_MAX_PLAIN_ID = 128
#: Principals whose key names are kept (pure functions of their arguments: a request of
#: a known principal builds no string).
_CACHED = 8192


@lru_cache(maxsize=_CACHED)
def principal_tag(kind: str, principal_id: str) -> str:
    """The hash tag of a principal: ``{kind:id}``.

    An id that contains a brace (which would end the tag early), is empty, or is long is
    replaced by ``#`` and the first 32 hex digits of its SHA-256, so the tag always names
    exactly one principal. Key ids are already SHA-256 digests and stay as they are.
    """
    if not principal_id or "{" in principal_id or "}" in principal_id or (
        len(principal_id) > _MAX_PLAIN_ID
    ):
        principal_id = "#" + hashlib.sha256(principal_id.encode()).hexdigest()[:32]
    return f"{{{kind}:{principal_id}}}"


@final
@attrs.frozen(kw_only=True)
class BudgetKeys:
    """The three keys of one principal's budget period; tag: :func:`principal_tag`.

    Attributes:
        counters: HASH with ``spend`` and ``reserved`` (nano-USD).
        holds: HASH request id -> reserved amount (nano-USD).
        leases: ZSET request id -> lease expiry (epoch ms).
    """

    counters: str
    holds: str
    leases: str

    def as_tuple(self) -> tuple[str, str, str]:
        """KEYS[1..3] of ``budget_reserve.lua`` and ``budget_settle.lua``."""
        return (self.counters, self.holds, self.leases)


@lru_cache(maxsize=_CACHED)
def budget_keys(kind: str, principal_id: str, period: int) -> BudgetKeys:
    """Keys of budget period ``period`` (see ``Limits.budget_period``) of a principal."""
    base = f"{PREFIX}:{principal_tag(kind, principal_id)}:bud:{period}"
    return BudgetKeys(counters=base, holds=f"{base}:res", leases=f"{base}:exp")


#: Length of a settlement-marker slice (one HASH per principal per slice).
MARKER_SLICE_MS = 60_000


def budget_marker(kind: str, principal_id: str, now_ms: int) -> str:
    """The HASH holding, as fields named by request id, the budget settlement markers of
    a principal declared at ``now_ms`` (same tag as its budget)."""
    return f"{PREFIX}:{principal_tag(kind, principal_id)}:bud:done:{now_ms // MARKER_SLICE_MS}"


#: Rate windows: requests, tokens, parallel slots.
RPM = "rpm"
TPM = "tpm"
PARALLEL = "parallel"


@lru_cache(maxsize=_CACHED)
def rate_window_key(
    kind: str, principal_id: str, window: str, model_group: str | None = None
) -> str:
    """The key of one rate window of a principal (same tag for all its windows).

    Args:
        window: :data:`RPM`, :data:`TPM` or :data:`PARALLEL`.
        model_group: for per-model RPM/TPM windows; None for the principal's own.
    """
    tag = principal_tag(kind, principal_id)
    if window == PARALLEL:
        if model_group is not None:
            raise ValueError("parallel slots are not per model group")
        return f"{PREFIX}:{tag}:rl:par"
    if window not in (RPM, TPM):
        raise ValueError(f"unknown rate window {window!r}")
    if model_group is None:
        return f"{PREFIX}:{tag}:rl:{window}"
    return f"{PREFIX}:{tag}:rl:{window}:m:{model_group}"


def rate_marker(kind: str, principal_id: str, now_ms: int) -> str:
    """The HASH holding, as fields named by request id, the rate-window settlement
    markers of a principal declared at ``now_ms``."""
    return f"{PREFIX}:{principal_tag(kind, principal_id)}:rl:done:{now_ms // MARKER_SLICE_MS}"


#: The hash tag of every identity row (one slot: one MGET fetches any mix of them).
IDENTITY_TAG = "{id}"
#: The pub/sub channel admin changes are announced on.
IDENTITY_CHANNEL = f"{PREFIX}:{IDENTITY_TAG}:invalidate"


def identity_generation() -> str:
    """The identity generation counter; tag ``{id}``."""
    return f"{PREFIX}:{IDENTITY_TAG}:gen"


def identity_row(kind: str, row_id: str) -> str:
    """A cached identity row (``kind`` = key, end_user or tag); tag ``{id}``.

    Key rows are keyed by the key's SHA-256; other ids are hashed when they hold braces
    or are long, as in :func:`principal_tag`.
    """
    if not row_id or "{" in row_id or "}" in row_id or len(row_id) > _MAX_PLAIN_ID:
        row_id = "#" + hashlib.sha256(row_id.encode()).hexdigest()[:32]
    return f"{PREFIX}:{IDENTITY_TAG}:{kind}:{row_id}"
