"""LiteLLM's request-level controls and response headers, for every model route.

In the body: ``fallbacks`` (model groups or aliases tried after the requested one),
``num_retries``, ``timeout`` (seconds) and ``drop_params``; in headers:
``x-litellm-timeout`` and ``x-litellm-num-retries``. Each is bounded by the config: a
request's retries by ``triogate.max_request_retries``, its timeout by each deployment's
own (a request may shorten a timeout, never lengthen it). None of them goes upstream.

Also here: the model a request names, resolved (group, alias or wildcard), the body a
deployment gets (``drop_params``), and the ``x-litellm-*`` response headers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from triogate.api import validate
from triogate.api.errors import ApiError
from triogate.providers.params import drop_unsupported
from triogate.routing.models import ModelRef, bind
from triogate.routing.router import RequestRouting

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.http import Request
    from triogate.api.records import Admission, Call
    from triogate.api.services import Services
    from triogate.config import Deployment

#: Most fallback groups a request may name (each adds one script to the routing read).
MAX_FALLBACKS = 8
#: Body fields that are requests to the gateway, never sent upstream.
CONTROL_FIELDS = ("fallbacks", "num_retries", "timeout", "drop_params")


def resolve_model(services: Services, body: Mapping[str, Any]) -> ModelRef:
    """The model the body names: a group, an alias, or a wildcard's match (404 if none)."""
    model = validate.field(body, "model", str, required=True, what="a string")
    ref = services.models.resolve(model)
    if ref is None:
        raise ApiError(
            404, f"model '{model}' does not exist or is not served by this gateway",
            "not_found_error", param="model", code="model_not_found",
        )
    return ref


def _number(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ApiError(400, f"'{name}' must be a number of seconds", param=name) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ApiError(400, f"'{name}' must be a number of seconds > 0", param=name)
    return float(value)


def _retries(value: Any, name: str, cap: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(400, f"'{name}' must be an integer >= 0", param=name)
    return min(value, cap)


def routing(services: Services, body: Mapping[str, Any], request: Request,
            ref: ModelRef) -> RequestRouting:
    """The request's routing controls, checked (400 naming the field when malformed)."""
    fallbacks: list[str] = []
    raw = body.get("fallbacks")
    if raw is not None:
        if not isinstance(raw, list) or not all(isinstance(f, (str, dict)) for f in raw):
            raise ApiError(400, "'fallbacks' must be a list of model names", param="fallbacks")
        if len(raw) > MAX_FALLBACKS:
            raise ApiError(400, f"'fallbacks' may name at most {MAX_FALLBACKS} models",
                           param="fallbacks")
        for item in raw:
            # LiteLLM also takes [{"model": ...}] items.
            name = item.get("model") if isinstance(item, dict) else item
            target = services.models.resolve(name) if isinstance(name, str) else None
            if target is None or target.wildcard:
                raise ApiError(400, f"fallback model {name!r} is not a model group here",
                               param="fallbacks")
            if target.group != ref.group and target.group not in fallbacks:
                fallbacks.append(target.group)
    cap = services.config.settings.max_request_retries
    headers = request.headers
    num_retries = _retries(body.get("num_retries"), "num_retries", cap)
    if num_retries is None:
        num_retries = _retries(headers.get("x-litellm-num-retries"), "x-litellm-num-retries",
                               cap)
    timeout_s = _number(body.get("timeout"), "timeout")
    if timeout_s is None:
        timeout_s = _number(headers.get("x-litellm-timeout"), "x-litellm-timeout")
    return RequestRouting(
        model=ref.model if ref.wildcard else None,
        fallbacks=tuple(fallbacks),
        num_retries=num_retries,
        timeout_s=timeout_s,
    )


def drop_params(body: Mapping[str, Any]) -> bool | None:
    """The request's own ``drop_params`` (None: the deployment's setting decides)."""
    value: bool | None = validate.field(body, "drop_params", bool, what="a boolean")
    return value


def body_for(call: Call, deployment: Deployment) -> Mapping[str, Any]:
    """What ``deployment`` is sent: with ``drop_params``, without what it cannot take."""
    drop = deployment.drop_params if call.drop_params is None else call.drop_params
    return drop_unsupported(call.api, call.body, deployment.provider) if drop else call.body


def deployments(services: Services, call: Call) -> tuple[Deployment, ...]:
    """The deployments of the call's group as the call would use them (wildcards bound)."""
    return tuple(bind(d, call.routing.model) for d in services.groups[call.group])


def litellm_headers(call: Call, admitted: Admission, *, deployment: Deployment | None,
                    cost_nanousd: int | None) -> dict[str, str]:
    """LiteLLM's response headers: call id, model id and group, cost, key spend.

    The key's spend is what admission already read for its budget check (no extra wait):
    absent when no budget was read (master key, or a key without a budget).
    """
    headers = {"x-litellm-call-id": call.trace_id, "x-litellm-model-group": call.group}
    if deployment is not None:
        headers["x-litellm-model-id"] = deployment.id
    if cost_nanousd is not None:
        headers["x-litellm-response-cost"] = _usd(cost_nanousd)
    spend = _key_spend(admitted)
    if spend is not None:
        headers["x-litellm-key-spend"] = _usd(spend + (cost_nanousd or 0))
    return headers


def _key_spend(admitted: Admission) -> int | None:
    """The key's spend this period, as the budget check read it at admission."""
    reservation = admitted.budgets.reservation if admitted.budgets is not None else None
    if reservation is None:
        return None
    return next((h.spend_nanousd for h in reservation.holds if h.kind == "key"), None)


def _usd(nanousd: int) -> str:
    text = f"{nanousd / 1_000_000_000:.9f}".rstrip("0")
    return text + "0" if text.endswith(".") else text
