"""``GET /guardrails/list`` and ``GET /v2/guardrails/list``: the config's guardrails.

LiteLLM's shape (``ListGuardrailsResponse``): ``{"guardrails": [{"guardrail_name",
"litellm_params": {"guardrail", "mode", "default_on"}, "guardrail_info"}]}``; the v2 route
adds ``guardrail_id`` and ``guardrail_definition_location`` (``"config"``: triogate has
no guardrails stored in the database, so the name is the id). Only those three
``litellm_params`` are shown: never an ``api_key``, nor the service's ``api_base`` or
its extra parameters, which may carry credentials. Any key may call them, as in LiteLLM
(a key's holder needs the names to ask for a guardrail). Pure rendering, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from triogate.api.http import Response

if TYPE_CHECKING:
    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.config_governance import GuardrailSpec


def render(spec: GuardrailSpec, *, v2: bool = False) -> dict[str, Any]:
    """One guardrail as LiteLLM lists it (no secret)."""
    out: dict[str, Any] = {
        "guardrail_name": spec.name,
        "litellm_params": {
            "guardrail": spec.kind,
            "mode": spec.modes[0] if len(spec.modes) == 1 else list(spec.modes),
            "default_on": spec.default_on,
        },
        "guardrail_info": dict(spec.info) if spec.info is not None else None,
    }
    if v2:
        out = {"guardrail_id": spec.name, **out, "guardrail_definition_location": "config"}
    return out


def _specs(services: Services) -> tuple[GuardrailSpec, ...]:
    guards = services.guardrails
    return guards.specs if guards is not None else ()


async def list_guardrails(services: Services, request: Request, caller: Caller
                          ) -> Response:
    """GET /guardrails/list."""
    await trio.lowlevel.checkpoint()
    return Response.json({"guardrails": [render(s) for s in _specs(services)]})


async def list_guardrails_v2(services: Services, request: Request, caller: Caller
                             ) -> Response:
    """GET /v2/guardrails/list."""
    await trio.lowlevel.checkpoint()
    return Response.json({"guardrails": [render(s, v2=True) for s in _specs(services)]})


#: (method, path) → handler, merged into the admin table.
ROUTES = {
    ("GET", "/guardrails/list"): list_guardrails,
    ("GET", "/v2/guardrails/list"): list_guardrails_v2,
}
