"""Helpers for routing tests: configs, and a fake ``routing_state.lua`` for RecordingBackend."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from triogate.config import (
    CacheSettings,
    Deployment,
    GatewayConfig,
    MockSettings,
    Price,
    RouterSettings,
)
from triogate.config_settings import TriogateSettings
from triogate.routing.state import DeploymentState, GroupState, RoutingState

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

NOW_MS = 1_699_999_990_000  # 10 s into an epoch minute


def dep(
    ident: str,
    group: str = "g",
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    weight: float = 1.0,
) -> Deployment:
    """A mock deployment with a fixed id."""
    return Deployment(
        id=ident,
        group=group,
        provider="mock",
        upstream_model=ident,
        api_base=None,
        api_key=None,
        rpm=rpm,
        tpm=tpm,
        timeout_s=30.0,
        stream_timeout_s=30.0,
        weight=weight,
        price=Price(),
        mode="chat",
        mock=MockSettings(),
        info={"id": ident},
    )


def make_config(
    *deployments: Deployment,
    strategy: str = "simple-shuffle",
    num_retries: int = 2,
    allowed_fails: int = 3,
    cooldown_s: float = 5.0,
    retry_after_s: float = 0.0,
    fallbacks: Mapping[str, tuple[str, ...]] | None = None,
) -> GatewayConfig:
    """A GatewayConfig with these deployments and router settings.

    Built directly rather than through ``parse_config`` so that these tests exercise
    routing alone.
    """
    return GatewayConfig(
        deployments=tuple(deployments),
        router=RouterSettings(
            strategy=strategy,
            num_retries=num_retries,
            timeout_s=None,
            allowed_fails=allowed_fails,
            cooldown_s=cooldown_s,
            retry_after_s=retry_after_s,
            fallbacks=dict(fallbacks or {}),
        ),
        master_key=None,
        database_url=None,
        cache=CacheSettings(enabled=False, ttl_s=60.0),
        request_timeout_s=None,
        settings=TriogateSettings(),
        source="<test>",
    )


def text(arg: object) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


def script_keys(wire: tuple[object, ...]) -> list[str]:
    """The KEYS of an EVALSHA/EVAL wire command."""
    n = int(text(wire[2]))
    return [text(k) for k in wire[3 : 3 + n]]


def script_args(wire: tuple[object, ...]) -> list[str]:
    """The ARGV of an EVALSHA/EVAL wire command."""
    n = int(text(wire[2]))
    return [text(a) for a in wire[3 + n :]]


def hash_tag(key: str) -> str:
    """The Redis Cluster hash tag of ``key`` (what is hashed for its slot)."""
    match = re.search(r"\{([^}]*)\}", key)
    assert match is not None and match.group(1), f"{key!r} has no hash tag"
    return match.group(1)


Row = tuple[int, int, int, int, int, str]  # rpm, tpm, fails, until_ms, in_flight, latency


def fake_state(
    rows: Mapping[str, Row] | None = None, *, claim: str | None = None
) -> Callable[[tuple[object, ...]], object]:
    """A RecordingBackend ``respond`` answering ``routing_state.lua`` calls.

    ``rows`` maps deployment id → its row (zeros when absent). In claim mode, ``claim``
    names the deployment the fake claims. Plain commands get None.
    """
    rows = rows or {}

    def respond(wire: tuple[object, ...]) -> object:
        if text(wire[0]).upper() not in ("EVALSHA", "EVAL"):
            return None  # other participants' plain commands
        args = script_args(wire)
        ids = args[6::3]
        claimed = 0
        if args[1] == "claim" and claim in ids:
            claimed = ids.index(claim) + 1
        out: list[object] = [claimed]
        for ident in ids:
            out.extend(rows.get(ident, (0, 0, 0, 0, 0, "")))
        return out

    return respond


def state_of(
    config: GatewayConfig,
    group: str = "g",
    *,
    rows: Mapping[str, Mapping[str, object]] | None = None,
    claimed: str | None = None,
    now_ms: int = NOW_MS,
    estimate_tokens: int = 0,
    request_id: str = "req",
) -> RoutingState:
    """A RoutingState as a read would return it, built directly (``rows``: id → fields)."""
    rows = rows or {}
    by_group = config.groups
    groups = []
    for g in (group, *config.router.fallbacks.get(group, ())):
        groups.append(
            GroupState(
                group=g,
                deployments=tuple(
                    DeploymentState(deployment=d, **rows.get(d.id, {}))  # type: ignore[arg-type]
                    for d in by_group[g]
                ),
            )
        )
    return RoutingState(
        group=group,
        groups=tuple(groups),
        request_id=request_id,
        estimate_tokens=estimate_tokens,
        now_ms=now_ms,
        claimed=claimed,
    )
