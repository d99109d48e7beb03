"""Redis key builders for routing state; the routing hash tags live here and nowhere else.

Every key of one model group shares the hash tag ``{rt:<group>}``, so that the one script
call per group (``routing_state.lua`` before the call, ``routing_record.lua`` after) touches
a single Redis Cluster slot. A deployment belongs to exactly one group, so its keys carry
its group's tag. Layout (``g`` = group, ``d`` = deployment id, ``m`` = epoch minute)::

    tg:{rt:g}:usage:m        HASH  rpm:<d>, tpm:<d>, fail:<d> of minute m (TTL ~2 min)
    tg:{rt:g}:cooldown       HASH  <d> -> cooling down until (epoch ms)
    tg:{rt:g}:latency        HASH  <d> -> latency EWMA (ms, decimal string)
    tg:{rt:g}:inflight:<d>   ZSET  request id -> lease expiry (epoch ms), least-busy claims
    tg:{rt:g}:recs:m         HASH  request id -> 1: records applied, declared in minute m
                                   (HSETNX; plus a PAD field; TTL 10 min + a minute)

Versions before the markers HASH wrote ``tg:{rt:g}:rec:<request>`` (a STRING per
request, 10 min): another name, so the two never misread each other.
"""

from __future__ import annotations

import hashlib

PREFIX = "tg"
MINUTE_MS = 60_000


def group_tag(group: str) -> str:
    """The hash tag of ``group``'s keys: ``{rt:<group>}``.

    A group name with a brace in it (or starting with ``#``) would break or fake the tag,
    so such names are replaced by ``#`` and a SHA-1 prefix of the name.
    """
    if "{" in group or "}" in group or group.startswith("#"):
        group = "#" + hashlib.sha1(group.encode()).hexdigest()[:20]
    return "{rt:" + group + "}"


def minute_of(now_ms: int) -> int:
    """The epoch minute containing ``now_ms``: the window of usage and failure counters."""
    return now_ms // MINUTE_MS


def usage_key(group: str, now_ms: int) -> str:
    """Usage and failure counters of ``group``'s deployments for the minute of ``now_ms``.

    Hash tag ``{rt:<group>}``.
    """
    return f"{PREFIX}:{group_tag(group)}:usage:{minute_of(now_ms)}"


def cooldown_key(group: str) -> str:
    """Cooldown deadlines (epoch ms) of ``group``'s deployments. Hash tag ``{rt:<group>}``."""
    return f"{PREFIX}:{group_tag(group)}:cooldown"


def latency_key(group: str) -> str:
    """Latency EWMAs (ms) of ``group``'s deployments. Hash tag ``{rt:<group>}``."""
    return f"{PREFIX}:{group_tag(group)}:latency"


def inflight_key(group: str, deployment_id: str) -> str:
    """Least-busy claims on one deployment: a ZSET of request ids scored by lease expiry.

    Hash tag ``{rt:<group>}`` (the deployment's group).
    """
    return f"{PREFIX}:{group_tag(group)}:inflight:{deployment_id}"


def record_markers_key(group: str, now_ms: int) -> str:
    """The HASH whose fields (request ids) say a post-call record for ``group`` declared in
    the minute of ``now_ms`` was applied; guards replays. Hash tag ``{rt:<group>}``.
    """
    return f"{PREFIX}:{group_tag(group)}:recs:{minute_of(now_ms)}"
