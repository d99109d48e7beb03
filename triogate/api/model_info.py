"""LiteLLM's model endpoints: the model list and the model and model-group info.

``GET /v1/models`` (and ``/models``) lists what the caller may use: model groups, visible
aliases, and for wildcard deployments the bundled price table's models of their provider
(``?return_wildcard_routes=true`` lists the patterns too); ``?team_id=`` narrows it to a
team's models. ``GET /v1/models/{id}`` answers one. ``/model/info`` and ``/v2/model/info``
describe each deployment, ``/model_group/info`` each group: never an api key, and a
virtual key sees only what it may use.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from triogate.api import auth
from triogate.api.errors import ApiError
from triogate.api.http import Response
from triogate.governance.model_access import ACCESS_GROUP
from triogate.routing.models import bind, table_models

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.config import Deployment

_TRUE = ("1", "true", "yes")


def _flag(request: Request, name: str) -> bool:
    return request.query.get(name, "").lower() in _TRUE


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "triogate"}


async def _allowed(services: Services, request: Request) -> Callable[[str], bool]:
    """Which model names the caller may use (``team_id`` narrows it to that team's)."""
    identity = await auth.authenticate_only(services, request)
    team_id = request.query.get("team_id")
    team_models: tuple[str, ...] | None = None
    if team_id:
        if identity is not None and (identity.team is None or identity.team.id != team_id):
            raise ApiError(403, "a key may only list its own team's models",
                           "permission_error", param="team_id")
        if identity is not None and identity.team is not None:
            team_models = identity.team.models
        elif services.store is not None:
            teams = await services.store.get_teams([team_id])
            if team_id not in teams:
                raise ApiError(404, f"team '{team_id}' not found", "not_found_error",
                               param="team_id")
            team_models = teams[team_id].models

    def allowed(name: str) -> bool:
        labels = (partial(frozenset, {ACCESS_GROUP + name}) if name in access_groups(services)
                  else partial(auth.group_providers, services, name))
        if identity is not None and identity.first_refusing(name, providers=labels) is not None:
            return False
        return not team_models or name in team_models or "*" in team_models

    return allowed


def expand(services: Services, group: str) -> list[str]:
    """The names a wildcard group serves: the price table's models of its providers that
    the group (and no other group) answers for."""
    providers = {d.provider for d in services.config.groups[group]}
    out: list[str] = []
    for model in table_models(providers):
        candidate = model if group == "*" else group.replace("*", model, 1)
        ref = services.models.resolve(candidate)
        if ref is not None and ref.group == group:
            out.append(candidate)
    return out


def _names(services: Services, request: Request) -> list[str]:
    """Every name a client may send, wildcards expanded from the price table."""
    out: list[str] = []
    for name in services.models.public_names():
        if "*" not in name:
            out.append(name)
            continue
        if _flag(request, "return_wildcard_routes"):
            out.append(name)
        out += expand(services, name)
    return list(dict.fromkeys(out))


async def models(services: Services, request: Request) -> Response:
    """``GET /v1/models``: the models this caller may use, in OpenAI's list shape.

    LiteLLM's ``include_model_access_groups=true`` adds the access groups
    (``model_info.access_groups``) the caller may use; ``only_model_access_groups=true``
    lists only those.
    """
    allowed = await _allowed(services, request)
    groups = [_model(g) for g in access_groups(services) if allowed(g)]
    if _flag(request, "only_model_access_groups"):
        return Response.json({"object": "list", "data": groups})
    data = [_model(n) for n in _names(services, request) if allowed(n)]
    if _flag(request, "include_model_access_groups"):
        data += groups
    return Response.json({"object": "list", "data": data})


def access_groups(services: Services) -> list[str]:
    """Every access group a deployment names, sorted."""
    return sorted({g for d in services.config.deployments
                   for g in d.info.get("access_groups", ())})


async def model(services: Services, request: Request) -> Response:
    """``GET /v1/models/{id}``: one model (a group, an alias or a wildcard's match)."""
    name = request.path.split("/models/", 1)[1]
    allowed = await _allowed(services, request)
    if services.models.resolve(name) is None or not allowed(name):
        raise ApiError(404, f"model '{name}' does not exist or is not served by this gateway",
                       "not_found_error", param="model", code="model_not_found")
    return Response.json(_model(name))


def _price(value: Any) -> float:
    return float(value)


def deployment_info(d: Deployment) -> dict[str, Any]:
    """One deployment as LiteLLM's ``/model/info`` describes it (no api key)."""
    params: dict[str, Any] = {"model": f"{d.provider}/{d.upstream_model}"}
    for name, value in (("api_base", d.api_base), ("rpm", d.rpm), ("tpm", d.tpm),
                        ("timeout", d.timeout_s), ("stream_timeout", d.stream_timeout_s),
                        ("weight", d.weight)):
        if value is not None:
            params[name] = value
    if d.drop_params:
        params["drop_params"] = True
    info = {
        **{k: v for k, v in d.info.items() if "key" not in k.lower()},
        "id": d.id,
        "mode": d.mode,
        "litellm_provider": d.provider,
        "key": d.upstream_model,
        "input_cost_per_token": _price(d.price.input_usd_per_token),
        "output_cost_per_token": _price(d.price.output_usd_per_token),
        "db_model": False,
    }
    return {"model_name": d.group, "litellm_params": params, "model_info": info}


async def _visible(services: Services, request: Request) -> list[Deployment]:
    allowed = await _allowed(services, request)
    return [d for d in services.config.deployments if allowed(d.group)]


async def model_info(services: Services, request: Request) -> Response:
    """``GET /model/info`` (``?litellm_model_id=`` for one deployment)."""
    wanted = request.query.get("litellm_model_id")
    data = [deployment_info(d) for d in await _visible(services, request)
            if wanted is None or d.id == wanted]
    return Response.json({"data": data})


def _positive(request: Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ApiError(400, f"query parameter '{name}' must be an integer >= 1", param=name)
    return int(raw)


async def model_info_v2(services: Services, request: Request) -> Response:
    """``GET /v2/model/info``: filters (``model``, ``modelId``, ``search``) and pages."""
    model_name, model_id = request.query.get("model"), request.query.get("modelId")
    search = (request.query.get("search") or "").lower()
    rows = [
        deployment_info(d) for d in await _visible(services, request)
        if (model_name is None or d.group == model_name)
        and (model_id is None or d.id == model_id)
        and (not search or search in d.group.lower())
    ]
    page, size = _positive(request, "page", 1), _positive(request, "size", 50)
    total_pages = max(1, -(-len(rows) // size))
    return Response.json({
        "data": rows[(page - 1) * size: page * size],
        "total_count": len(rows), "current_page": page, "size": size,
        "total_pages": total_pages,
    })


_CAPABILITIES = ("max_input_tokens", "max_output_tokens", "supports_function_calling",
                 "supports_vision", "supports_parallel_function_calling",
                 "supports_response_schema", "supports_reasoning")


async def model_group_info(services: Services, request: Request) -> Response:
    """``GET /model_group/info`` (``?model_group=`` for one group).

    A wildcard group (``anthropic/*``) is listed, then each model of the price table it
    serves, as its own entry (prices bound as a request for it would be charged), as
    LiteLLM expands them."""
    allowed = await _allowed(services, request)
    wanted = request.query.get("model_group")
    data = []
    for group, deployments in services.config.groups.items():
        named: list[tuple[str, Sequence[Deployment]]] = [(group, deployments)]
        if "*" in group:
            named += [(model, [bind(d, model) for d in deployments])
                      for model in expand(services, group)]
        for name, bound in named:
            if (wanted is None or name == wanted) and allowed(name):
                data.append(_group_entry(services, name, group, bound))
    return Response.json({"data": data})


def _group_entry(services: Services, name: str, group: str,
                 deployments: Sequence[Deployment]) -> dict[str, Any]:
    """One ``/model_group/info`` entry: ``name`` served by ``group``'s ``deployments``."""
    rpms = [d.rpm for d in deployments]
    tpms = [d.tpm for d in deployments]
    entry: dict[str, Any] = {
        "model_group": name,
        "providers": sorted({d.provider for d in deployments}),
        "mode": deployments[0].mode,
        "input_cost_per_token": max(_price(d.price.input_usd_per_token)
                                    for d in deployments),
        "output_cost_per_token": max(_price(d.price.output_usd_per_token)
                                     for d in deployments),
        "rpm": None if None in rpms else sum(r or 0 for r in rpms),
        "tpm": None if None in tpms else sum(t or 0 for t in tpms),
        "is_public_model_group": True,
        "is_wildcard": "*" in name,
        "aliases": sorted(a for a, g in services.models.aliases.items() if g == name),
    }
    if name != group:
        entry["wildcard_group"] = group
    for capability in _CAPABILITIES:
        values = [d.info[capability] for d in deployments if capability in d.info]
        if values:
            entry[capability] = min(values) if capability.startswith("max_") else all(
                values)
    return entry
