"""Azure OpenAI's paths: ``/openai/deployments/{model}/chat/completions`` and ``/embeddings``.

The model (a group, alias or wildcard match) comes from the path, as Azure clients send
it; the key from ``api-key`` or ``Authorization``. ``api-version`` is accepted and unused.

As in LiteLLM, a deployment the key may not use is a **401** ``key not allowed to access
model`` here (403 ``model_not_allowed`` on the other routes), and it is answered before
anything reveals whether the deployment exists: an unknown deployment is a 404 only for
a key whose models would include it (the master key, a key without a model list).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api import auth, chat, completions, embeddings
from triogate.api.errors import ApiError
from triogate.api.rebody import rebodied

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.http import Request, Response
    from triogate.api.services import Services

PREFIX = "/openai/deployments/"
SUFFIXES = ("/chat/completions", "/embeddings", "/completions")


def _model(request: Request, suffix: str) -> str:
    model = request.path[len(PREFIX):-len(suffix)]
    if not model:
        raise ApiError(404, f"no route {request.method} {request.path}", "not_found_error")
    return model


def _with_model(request: Request, suffix: str) -> Request:
    model = _model(request, suffix)

    def rewrite(body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "model": model}

    return rebodied(request, rewrite)


def _denied(model: str, models: tuple[str, ...] | None) -> ApiError:
    allowed = "" if models is None else f" This key can only access models={list(models)}."
    return ApiError(401, f"key not allowed to access model.{allowed} Tried to access {model}",
                    "authentication_error", param="model", code="key_model_access_denied")


async def _guarded(services: Services, request: Request, suffix: str,
                   handler: Callable[[Services, Request], Awaitable[Response]]) -> Response:
    model = _model(request, suffix)
    if services.models.resolve(model) is None:
        # Not served: whether the key may use that name decides between 401 and 404, so
        # that a restricted key learns nothing about deployments outside its list.
        identity = await auth.authenticate_only(services, request)
        if identity is not None and model not in identity.key.aliases:
            party = identity.first_refusing(model)
            if party is not None:
                raise _denied(model, party.models)
    try:
        return await handler(services, _with_model(request, suffix))
    except ApiError as exc:
        if exc.code == "model_not_allowed":
            raise _denied(model, None) from None
        raise


async def chat_completions(services: Services, request: Request) -> Response:
    return await _guarded(services, request, "/chat/completions", chat.chat_completions)


async def create_embeddings(services: Services, request: Request) -> Response:
    return await _guarded(services, request, "/embeddings", embeddings.create_embeddings)


async def legacy_completions(services: Services, request: Request) -> Response:
    return await _guarded(services, request, "/completions", completions.completions)
