"""Path → handler: a table, no logic. LiteLLM's paths, with and without ``/v1``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import attrs

from triogate.api import admin, chat, embeddings, health, messages, responses

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.errors import Style
    from triogate.api.http import Request, Response
    from triogate.api.services import Services

    Handler = Callable[[Services, Request], Awaitable[Response]]


@attrs.frozen
class Route:
    """A handler, the error shape of its API, and its name in metrics."""

    handler: Handler
    style: Style = "openai"
    name: str = "-"
    kind: Literal["model", "admin", "public"] = "public"


def _model(handler: Handler, name: str, style: Style = "openai") -> Route:
    return Route(handler, style, name, "model")


def table() -> dict[tuple[str, str], Route]:
    """Every route, keyed by (method, path)."""
    routes: dict[tuple[str, str], Route] = {
        ("GET", "/health/liveliness"): Route(health.liveliness, name="liveliness"),
        ("GET", "/health/liveness"): Route(health.liveliness, name="liveliness"),
        ("GET", "/health/readiness"): Route(health.readiness, name="readiness"),
        ("GET", "/metrics"): Route(health.metrics, name="metrics"),
    }
    for prefix in ("/v1", ""):
        routes[("POST", f"{prefix}/chat/completions")] = _model(chat.chat_completions, "chat")
        routes[("POST", f"{prefix}/messages")] = _model(messages.create_message, "messages",
                                                       "anthropic")
        routes[("POST", f"{prefix}/responses")] = _model(responses.create_response, "responses")
        routes[("POST", f"{prefix}/embeddings")] = _model(embeddings.create_embeddings,
                                                         "embeddings")
        routes[("GET", f"{prefix}/models")] = Route(health.models, name="models", kind="model")
    for (method, path), handler in admin.routes().items():
        routes[(method, path)] = Route(handler, "openai", path, "admin")
    return routes
