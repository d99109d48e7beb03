"""LiteLLM's governance settings: the proxy-wide budget, budget alerts and guardrails.

Pure functions of already-structured values, called by :mod:`triogate.config` while it
normalises a file. Money comes out in integer nano-USD, durations in seconds, so that
governance builds its principals and guardrails without parsing anything per request.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import attrs

from triogate.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: Where alerts can go (``general_settings.alerting``).
ALERTING = ("webhook",)
#: Guardrail modes, as LiteLLM names them.
MODES = ("pre_call", "during_call", "post_call")
#: Built-in guardrails: LiteLLM's content filter (keywords, regexes, prebuilt PII
#: patterns) and its generic guardrail API (a service the operator runs).
CONTENT_FILTER, GENERIC_API = "litellm_content_filter", "generic_guardrail_api"
ACTIONS = ("BLOCK", "MASK")
#: Prebuilt patterns of the content filter: e-mail addresses, phone numbers, card numbers.
PREBUILT = {
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",
    "phone": r"(?<![\w+])(?<!\d[ ().-])\+?\(?(?:\d[ ().-]{0,2}){8,14}\d(?!\w|[ ().-]?\d)",
    "credit_card": r"(?<!\d)(?<!\d[ -])(?:\d[ -]?){12,18}\d(?![ -]?\d)",
}
_DURATION = re.compile(r"^\s*(\d+)\s*(mo|s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400, "mo": 30 * 86_400}
_MAX_NANOUSD = 2**53 - 1


@attrs.frozen(kw_only=True)
class Pattern:
    """One rule of a content filter: a compiled regex, its name and its action."""

    name: str
    regex: re.Pattern[str]
    action: str


@attrs.frozen(kw_only=True)
class GuardrailSpec:
    """One ``guardrails:`` entry, checked.

    Attributes:
        name: ``guardrail_name``.
        kind: :data:`CONTENT_FILTER` or :data:`GENERIC_API`.
        modes: when it runs (:data:`MODES`).
        default_on: on every request; else only on requests naming it (``guardrails``).
        patterns: the content filter's rules (keywords become escaped regexes).
        api_base, api_key, params, timeout_s: the generic guardrail API's service.
        info: ``guardrail_info`` as written (a description for ``/guardrails/list``).
    """

    name: str
    kind: str
    modes: tuple[str, ...]
    default_on: bool = False
    patterns: tuple[Pattern, ...] = ()
    api_base: str | None = None
    api_key: str | None = attrs.field(default=None, repr=False)
    params: Mapping[str, Any] = attrs.Factory(dict)
    timeout_s: float = 10.0
    info: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class GovernanceFeatures:
    """The proxy-wide budget, where alerts go, and the guardrails."""

    proxy_max_budget_nanousd: int | None = None
    proxy_budget_duration_s: int | None = None
    alert_webhook_url: str | None = attrs.field(default=None, repr=False)
    guardrails: tuple[GuardrailSpec, ...] = ()


def duration_s(path: str, text: Any) -> int:
    """Seconds in a LiteLLM duration (``30s``, ``15m``, ``1h``, ``1d``, ``1w``, ``1mo``)."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) == 0:
        raise ConfigError(f"{path}: invalid duration {text!r}: expected a positive integer "
                          "followed by s, m, h, d, w or mo (e.g. '30s', '1h', '30d')")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def nanousd(path: str, value: Any) -> int:
    """USD (a number or a numeric string) → integer nano-USD."""
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise ConfigError(f"{path}: not a number of USD: {value!r}") from None
    if isinstance(value, bool) or not amount.is_finite() or amount < 0:
        raise ConfigError(f"{path}: must be a non-negative number of USD")
    out = int((amount * 1_000_000_000).to_integral_value(rounding=ROUND_HALF_UP))
    if out > _MAX_NANOUSD:
        raise ConfigError(f"{path}: too large")
    return out


def governance_features(
    *, max_budget: Any, budget_duration: str | None, alerting: Sequence[str],
    webhook_url: str | None, guardrails: Sequence[Mapping[str, Any]],
) -> GovernanceFeatures:
    """Check and normalise the settings.

    Raises:
        ConfigError: anything wrong, with its key path.
    """
    budget = None if max_budget is None else nanousd("$.litellm_settings.max_budget",
                                                     max_budget)
    if budget == 0:  # LiteLLM's default, meaning no proxy budget
        budget = None
    period = None if budget_duration is None else duration_s(
        "$.litellm_settings.budget_duration", budget_duration)
    for i, name in enumerate(alerting):
        if name not in ALERTING:
            raise ConfigError(f"$.general_settings.alerting[{i}]: {name!r} is not supported "
                              f"(built in: {', '.join(ALERTING)})")
    if alerting and not webhook_url:
        raise ConfigError("$.general_settings.alerting_webhook_url: required by "
                          "alerting: [webhook]")
    specs = tuple(_guardrail(f"$.guardrails[{i}]", g) for i, g in enumerate(guardrails))
    names = [g.name for g in specs]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"$.guardrails: guardrail_name {name!r} is used twice")
    return GovernanceFeatures(
        proxy_max_budget_nanousd=budget, proxy_budget_duration_s=period,
        alert_webhook_url=webhook_url if alerting else None, guardrails=specs)


def _guardrail(path: str, raw: Any) -> GuardrailSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with guardrail_name and litellm_params")
    extra = set(raw) - {"guardrail_name", "litellm_params", "guardrail_info"}
    if extra:
        raise ConfigError(f"{path}.{sorted(extra)[0]}: unsupported key (not known to triogate)")
    name = raw.get("guardrail_name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}.guardrail_name: required (a non-empty string)")
    params = raw.get("litellm_params")
    if not isinstance(params, dict):
        raise ConfigError(f"{path}.litellm_params: required (a mapping)")
    info = raw.get("guardrail_info")
    if info is not None and not isinstance(info, dict):
        raise ConfigError(f"{path}.guardrail_info: must be a mapping")
    path = f"{path}.litellm_params"
    kind = params.get("guardrail")
    if kind not in (CONTENT_FILTER, GENERIC_API):
        raise ConfigError(f"{path}.guardrail: {kind!r} is not built in (built in: "
                          f"{CONTENT_FILTER}, {GENERIC_API})")
    mode = params.get("mode", "pre_call")
    modes = tuple(mode) if isinstance(mode, list) else (mode,)
    if not modes or any(m not in MODES for m in modes):
        raise ConfigError(f"{path}.mode: {mode!r}: expected one of {', '.join(MODES)} "
                          "(or a list of them)")
    known = {"guardrail", "mode", "default_on", "blocked_words", "patterns", "api_base",
             "api_key", "additional_provider_specific_params", "timeout"}
    extra = set(params) - known
    if extra:
        raise ConfigError(f"{path}.{sorted(extra)[0]}: unsupported key (not known to triogate)")
    default_on = params.get("default_on", False)
    if not isinstance(default_on, bool):
        raise ConfigError(f"{path}.default_on: must be true or false")
    if kind == CONTENT_FILTER:
        patterns = (*_words(f"{path}.blocked_words", params.get("blocked_words") or []),
                    *_patterns(f"{path}.patterns", params.get("patterns") or []))
        if not patterns:
            raise ConfigError(f"{path}: a content filter needs blocked_words or patterns")
        return GuardrailSpec(name=name, kind=kind, modes=modes, default_on=default_on,
                             patterns=patterns, info=info)
    api_base = params.get("api_base")
    if not isinstance(api_base, str) or not api_base.startswith(("http://", "https://")):
        raise ConfigError(f"{path}.api_base: required (the guardrail service's http(s) URL)")
    extra_params = params.get("additional_provider_specific_params") or {}
    if not isinstance(extra_params, dict):
        raise ConfigError(f"{path}.additional_provider_specific_params: must be a mapping")
    timeout = params.get("timeout", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"{path}.timeout: must be a positive number of seconds")
    key = params.get("api_key")
    return GuardrailSpec(name=name, kind=kind, modes=modes, default_on=default_on,
                         api_base=api_base.rstrip("/"),
                         api_key=key if isinstance(key, str) else None,
                         params=dict(extra_params), timeout_s=float(timeout), info=info)


def _action(path: str, value: Any) -> str:
    action = str(value or "BLOCK").upper()
    if action not in ACTIONS:
        raise ConfigError(f"{path}: {value!r}: expected BLOCK or MASK")
    return action


def _words(path: str, raw: Any) -> list[Pattern]:
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: must be a list of {{keyword, action}}")
    out = []
    for i, entry in enumerate(raw):
        word = entry.get("keyword") if isinstance(entry, dict) else entry
        if not isinstance(word, str) or not word:
            raise ConfigError(f"{path}[{i}].keyword: required (a non-empty string)")
        action = _action(f"{path}[{i}].action",
                         entry.get("action") if isinstance(entry, dict) else None)
        regex = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)
        out.append(Pattern(name=word, regex=regex, action=action))
    return out


def _patterns(path: str, raw: Any) -> list[Pattern]:
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: must be a list of patterns")
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}[{i}]: must be a mapping")
        kind = entry.get("pattern_type", "prebuilt")
        action = _action(f"{path}[{i}].action", entry.get("action"))
        if kind == "prebuilt":
            name = entry.get("pattern_name")
            if name not in PREBUILT:
                raise ConfigError(f"{path}[{i}].pattern_name: {name!r}: expected one of "
                                  f"{', '.join(PREBUILT)}")
            out.append(Pattern(name=name, regex=re.compile(PREBUILT[name]), action=action))
        elif kind == "regex":
            text, name = entry.get("pattern"), entry.get("name") or "pattern"
            try:
                regex = re.compile(text) if isinstance(text, str) and text else None
            except re.error as exc:
                raise ConfigError(f"{path}[{i}].pattern: not a valid regex: {exc}") from None
            if regex is None:
                raise ConfigError(f"{path}[{i}].pattern: required (a regex)")
            out.append(Pattern(name=str(name), regex=regex, action=action))
        else:
            raise ConfigError(f"{path}[{i}].pattern_type: {kind!r}: expected prebuilt or regex")
    return out
