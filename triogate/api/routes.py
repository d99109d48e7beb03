"""Path → handler: a table, no logic. LiteLLM's paths, with and without ``/v1``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from triogate.api import (
    azure,
    chat,
    completions,
    embeddings,
    health,
    messages,
    model_health,
    model_info,
    moderations,
    responses,
)
from triogate.api.admin import unsupported
from triogate.api.admin.routes import regenerate_by_path
from triogate.api.admin.routes import routes as admin_routes
from triogate.api.admin.unsupported import routes as unsupported_routes
from triogate.ui.routes import routes as ui_routes

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.errors import Style
    from triogate.api.http import Request, Response
    from triogate.api.services import Services

    Handler = Callable[[Services, Request], Awaitable[Response]]


@attrs.frozen
class Route:
    """A handler and the error shape of its API."""

    handler: Handler
    style: Style = "openai"


def table() -> dict[tuple[str, str], Route]:
    """Every route, keyed by (method, path)."""
    routes: dict[tuple[str, str], Route] = {
        ("GET", "/health/liveliness"): Route(health.liveliness),
        ("GET", "/health/liveness"): Route(health.liveliness),
        ("GET", "/health/readiness"): Route(health.readiness),
        ("GET", "/metrics"): Route(health.metrics),
        ("GET", "/health"): Route(model_health.health),
        ("GET", "/model/info"): Route(model_info.model_info),
        ("GET", "/v1/model/info"): Route(model_info.model_info),
        ("GET", "/v2/model/info"): Route(model_info.model_info_v2),
        ("GET", "/model_group/info"): Route(model_info.model_group_info),
    }
    for prefix in ("/v1", ""):
        routes[("POST", f"{prefix}/chat/completions")] = Route(chat.chat_completions)
        routes[("POST", f"{prefix}/messages")] = Route(messages.create_message, "anthropic")
        routes[("POST", f"{prefix}/responses")] = Route(responses.create_response)
        routes[("POST", f"{prefix}/embeddings")] = Route(embeddings.create_embeddings)
        routes[("POST", f"{prefix}/completions")] = Route(completions.completions)
        routes[("POST", f"{prefix}/moderations")] = Route(moderations.create_moderation)
        routes[("GET", f"{prefix}/models")] = Route(model_info.models)
    for (method, path), handler in {**unsupported_routes(), **admin_routes()}.items():
        routes[(method, path)] = Route(handler)
    routes.update({k: Route(handler) for k, handler in ui_routes().items()})  # the dashboard
    return routes


#: Routes with a path parameter: (method, prefix, suffix) → route; the parameter is what
#: lies between (handlers read it from ``request.path``).
PATTERNS: tuple[tuple[str, str, str, Route], ...] = (
    ("POST", azure.PREFIX, "/chat/completions", Route(azure.chat_completions)),
    ("POST", azure.PREFIX, "/embeddings", Route(azure.create_embeddings)),
    ("POST", azure.PREFIX, "/completions", Route(azure.legacy_completions)),
    ("GET", "/v1/models/", "", Route(model_info.model)),
    ("GET", "/models/", "", Route(model_info.model)),
    ("POST", "/key/", "/regenerate", Route(regenerate_by_path())),
    # LiteLLM routes triogate does not have, with an id in the path: a 400 naming them.
    *((method, prefix, "", Route(unsupported.refuse(what)))
      for method, prefix, what in unsupported.PREFIXES),
    *(("POST", azure.PREFIX, suffix, Route(unsupported.refuse(what)))
      for suffix, what in unsupported.AZURE_SUFFIXES),
)


def refused_for_every_caller(method: str, path: str) -> bool:
    """Whether ``path`` is a LiteLLM route triogate does not have: its 400 depends on no key,
    so the head check lets it through without one."""
    if (method, path) in unsupported.UNSUPPORTED:
        return True
    if any(m == method and path.startswith(prefix) for m, prefix, _ in unsupported.PREFIXES):
        return True
    return (method == "POST" and path.startswith(azure.PREFIX)
            and path.endswith(tuple(suffix for suffix, _ in unsupported.AZURE_SUFFIXES)))


def find(routes: dict[tuple[str, str], Route], method: str, path: str) -> Route | None:
    """The route of ``path``: an exact one, else the first pattern it fits."""
    route = routes.get((method, path))
    if route is not None:
        return route
    for m, prefix, suffix, candidate in PATTERNS:
        if (m == method and path.startswith(prefix) and path.endswith(suffix)
                and len(path) > len(prefix) + len(suffix)):
            return candidate
    return None
