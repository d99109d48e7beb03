"""Deployments (health, cooldowns, in-flight, latency, usage-based load) and the loaded
configuration with every secret redacted."""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import yaml

from triogate.batch import BatchError, open_batch_scope, redact_url
from triogate.ui import stats
from triogate.ui.html import Html, badge, el, meter, number, table
from triogate.ui.layout import section

if TYPE_CHECKING:
    from triogate.api.http import Response
    from triogate.config import GatewayConfig
    from triogate.routing.state import DeploymentState
    from triogate.ui.context import Ctx

REDACTED = "*** redacted ***"
#: Field names whose values are secrets, wherever they appear (``api_key``, ``password``).
SECRET_NAME = re.compile(
    r"((^|_)(key|token|auth)$)|secret|passw|credential|private|webhook", re.I)
#: Names that match but hold no secret.
NOT_SECRET = re.compile(r"per_token|cache_key|key_hash|routing_key", re.I)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name)) and not NOT_SECRET.search(name)


def _plain(value: Any, name: str, secrets: tuple[str, ...]) -> Any:
    if attrs.has(type(value)):
        return {f.name: _plain(getattr(value, f.name), f.name, secrets)
                for f in attrs.fields(type(value))}
    if isinstance(value, Mapping):
        return {str(k): _plain(v, str(k), secrets) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v, name, secrets) for v in value]
    if value is not None and is_secret_name(name):
        return REDACTED
    if isinstance(value, str):
        text = redact_url(value) if "://" in value else value
        for secret in secrets:
            text = text.replace(secret, REDACTED)
        return text
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, Path | decimal.Decimal | datetime.date):
        return str(value)
    return value


def redacted(config: GatewayConfig) -> dict[str, Any]:
    """The configuration as plain data, secrets replaced wherever they appear (by field
    name, inside URLs, and by value: a secret copied into another field is caught too)."""
    secrets = tuple(s for s in (config.master_key, config.database_url,
                                *(d.api_key for d in config.deployments)) if s and len(s) >= 4)
    plain = _plain(config, "config", secrets)
    if config.database_url:
        plain["database_url"] = redact_url(config.database_url)
        for secret in secrets:
            if secret != config.database_url:
                plain["database_url"] = plain["database_url"].replace(secret, REDACTED)
    assert isinstance(plain, dict)
    return plain


async def config_page(ctx: Ctx) -> Response:
    """GET /ui/config."""
    text = yaml.safe_dump(redacted(ctx.services.config), sort_keys=False, allow_unicode=True,
                          default_flow_style=False)
    content = section("Loaded configuration", el("pre", text, class_="config"),
                      note=f"From {ctx.services.config.source}, normalised (durations in "
                           "seconds). Keys, passwords and tokens are redacted.")
    return ctx.page("Configuration", content, active="config")


def _limit(used: int, cap: int | None) -> str:
    return f"{used:,} / {cap:,}" if cap else f"{used:,}"


def _state_row(s: DeploymentState, now_ms: int, served: Mapping[str, tuple[float, float]]
               ) -> list[Any]:
    d = s.deployment
    cooling = s.cooldown_until_ms > now_ms
    health = (badge("cooling down", "bad") if cooling else
              badge(f"{s.fails} failures", "warn") if s.fails else badge("healthy", "ok"))
    if cooling:
        health = el("span", health, " ",
                    f"{(s.cooldown_until_ms - now_ms) / 1000:,.0f} s left", class_="nowrap")
    loads = [used / cap for used, cap in ((s.rpm_used, d.rpm), (s.tpm_used, d.tpm)) if cap]
    load = meter(max(loads), 1, f"{max(loads):.0%}") if loads else "no limits"
    count, errors = served.get(d.id, (0.0, 0.0))
    # The upstream names the deployment for a person; its id (routing, logs) sits below.
    name = el("span", f"{d.provider}/{d.upstream_model}", el("br"),
              el("code", d.id, class_="sub"))
    return [name, health, number(s.in_flight),
            "—" if s.latency_ms is None else f"{s.latency_ms:,.0f} ms",
            _limit(s.rpm_used, d.rpm), _limit(s.tpm_used, d.tpm), load,
            f"{count:,.0f}" + (f" ({errors:,.0f} failed)" if errors else "")]


async def deployments(ctx: Ctx) -> Response:
    """GET /ui/deployments: one Redis round trip for every group's state."""
    services = ctx.services
    groups = sorted(services.config.groups)
    now_ms = services.clock_ms()
    async with open_batch_scope(services.backends) as scope:
        part = scope.start_participant(
            partial(services.router.snapshot, scope.batch, groups, now_ms=now_ms),
            name="routing")
    try:
        states = part.result()
    except BatchError:
        states = []
    served: dict[str, tuple[float, float]] = {}
    for (name, labels), value in stats.snapshot(services).items():
        if name == "triogate_requests_total":
            fields = dict(labels)
            count, errors = served.get(fields.get("deployment", "-"), (0.0, 0.0))
            bad = value if fields.get("status", "2")[:1] in "45" else 0.0
            served[fields.get("deployment", "-")] = (count + value, errors + bad)
    headers = ("Model group", "Deployment", "Health", "In flight", "Latency",
               "RPM this minute", "TPM this minute", "Load", "Served here")
    rows = []
    for state in states:
        group = el("strong", state.group)
        if state.degraded:
            group = el("span", group, " ", badge("local view", "warn"),
                       title="Redis did not answer: this process's own view")
        for i, s in enumerate(state.deployments):
            rows.append([group if i == 0 else "", *_state_row(s, now_ms, served)])
    parts = [section("Deployments by model group", table(headers, rows, numeric=(3, 4, 5, 6, 8)))]
    intro = el("p", f"Strategy: {services.router.strategy}. Usage, cooldowns and latency are "
                    "shared by every gateway process through Redis; “Served here” counts this "
                    "process's requests since it started.", class_="note")
    return ctx.page("Deployments", Html(intro + "".join(parts)), active="deployments",
                    refresh_s=10)
