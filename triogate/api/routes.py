"""Path → handler: a table, no logic. LiteLLM's paths, with and without ``/v1``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from triogate.api import chat, embeddings, health, messages, responses
from triogate.api.admin.routes import routes as admin_routes
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
    }
    for prefix in ("/v1", ""):
        routes[("POST", f"{prefix}/chat/completions")] = Route(chat.chat_completions)
        routes[("POST", f"{prefix}/messages")] = Route(messages.create_message, "anthropic")
        routes[("POST", f"{prefix}/responses")] = Route(responses.create_response)
        routes[("POST", f"{prefix}/embeddings")] = Route(embeddings.create_embeddings)
        routes[("GET", f"{prefix}/models")] = Route(health.models)
    for (method, path), handler in admin_routes().items():
        routes[(method, path)] = Route(handler)
    routes.update({k: Route(handler) for k, handler in ui_routes().items()})  # the dashboard
    return routes
