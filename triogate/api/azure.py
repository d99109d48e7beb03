"""Azure OpenAI's paths: ``/openai/deployments/{model}/chat/completions`` and ``/embeddings``.

The model (a group, alias or wildcard match) comes from the path, as Azure clients send
it; the key from ``api-key`` or ``Authorization``. ``api-version`` is accepted and unused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api import chat, completions, embeddings
from triogate.api.errors import ApiError
from triogate.api.rebody import rebodied

if TYPE_CHECKING:
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


async def chat_completions(services: Services, request: Request) -> Response:
    return await chat.chat_completions(services, _with_model(request, "/chat/completions"))


async def create_embeddings(services: Services, request: Request) -> Response:
    return await embeddings.create_embeddings(services, _with_model(request, "/embeddings"))


async def legacy_completions(services: Services, request: Request) -> Response:
    return await completions.completions(services, _with_model(request, "/completions"))
