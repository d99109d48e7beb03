"""LiteLLM routes for features triogate leaves out, answered with a 400 that says so.

Organizations, SSO / UI login, creating or applying guardrails over the API, runtime
model management (``/model/new`` and friends), configuration over the API
(``/config/...``, ``/settings``, ``/get/config/callbacks``), LiteLLM's ``/routes``
listing, images, audio, files, batches, fine-tuning, rerank, assistants and vector
stores are not part of triogate. A LiteLLM script or SDK that calls them gets a 400 in
OpenAI's error shape (``code: unsupported_feature``) naming what is missing and what to
use instead, never a 404 that could pass for a typo, a 401 that sends its author looking
for a key problem, or a success that did nothing. The answer does not depend on the key
(it says only what the documentation says), so it is the same for every caller.

Routes with an id in the path (``/v1/files/{id}``, ``/v1/batches/{id}/cancel``,
``/openai/deployments/{model}/images/generations``) are matched by prefix
(:data:`PREFIXES`, :data:`AZURE_SUFFIXES`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from triogate.api.errors import ApiError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.http import Request, Response
    from triogate.api.services import Services

    Handler = Callable[[Services, Request], Awaitable[Response]]

_ORGS = ("organizations: triogate has keys, teams, users, customers and tags; group teams "
         "by naming them, and give each its own budget")
_SSO = ("SSO / UI login: the admin API takes the master key or a virtual key, and the "
        "dashboard (/ui) signs in with one")
_GUARDRAILS = ("creating or applying guardrails over the API: configure them in the config "
               "file's guardrails: (docs/governance-features.md); GET /guardrails/list "
               "lists them")
_MODELS = ("runtime model management: deployments come from the config file's model_list "
           "(restart, or roll the processes, to change them)")
_IMAGES = "image generation (images/generations, edits, variations): call the provider directly"
_AUDIO = ("audio (speech, transcriptions, translations): call the provider directly")
_FILES = "the files API: upload files to the provider directly"
_BATCHES = "the batches API: submit batches to the provider directly"
_FINE_TUNING = "fine-tuning jobs: create them with the provider directly"
_RERANK = "rerank: call the provider directly"
_ASSISTANTS = "assistants and threads: call the provider directly"
_VECTOR = "vector stores: call the provider directly"
_CONFIG = ("reading or changing the configuration over the API: edit the config file and "
           "restart (or roll) the processes; the dashboard's /ui/config shows the loaded "
           "configuration (secrets redacted), /model/info the deployments")
_ROUTES = ("a route listing: docs/migrating-from-litellm.md lists every route and who may "
           "call it")

#: OpenAI-style paths (with and without ``/v1``) → what is missing.
_OPENAI_PATHS: dict[tuple[str, str], str] = {
    ("POST", "/images/generations"): _IMAGES,
    ("POST", "/images/edits"): _IMAGES,
    ("POST", "/images/variations"): _IMAGES,
    ("POST", "/audio/speech"): _AUDIO,
    ("POST", "/audio/transcriptions"): _AUDIO,
    ("POST", "/audio/translations"): _AUDIO,
    ("POST", "/files"): _FILES,
    ("GET", "/files"): _FILES,
    ("POST", "/batches"): _BATCHES,
    ("GET", "/batches"): _BATCHES,
    ("POST", "/fine_tuning/jobs"): _FINE_TUNING,
    ("GET", "/fine_tuning/jobs"): _FINE_TUNING,
    ("POST", "/rerank"): _RERANK,
    ("POST", "/assistants"): _ASSISTANTS,
    ("GET", "/assistants"): _ASSISTANTS,
    ("POST", "/threads"): _ASSISTANTS,
    ("POST", "/vector_stores"): _VECTOR,
    ("GET", "/vector_stores"): _VECTOR,
}

#: (method, path prefix) → what is missing, for paths that carry an id.
PREFIXES: tuple[tuple[str, str, str], ...] = tuple(
    (method, f"{v1}{path}/", what)
    for v1 in ("/v1", "")
    for method in ("GET", "POST", "DELETE")
    for path, what in (("/files", _FILES), ("/batches", _BATCHES),
                       ("/fine_tuning/jobs", _FINE_TUNING), ("/assistants", _ASSISTANTS),
                       ("/threads", _ASSISTANTS), ("/vector_stores", _VECTOR))
)

#: Suffixes of the Azure route (``/openai/deployments/{model}<suffix>``) → what is missing.
AZURE_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("/images/generations", _IMAGES),
    ("/audio/speech", _AUDIO),
    ("/audio/transcriptions", _AUDIO),
    ("/audio/translations", _AUDIO),
)

#: (method, path) → what is missing.
UNSUPPORTED: dict[tuple[str, str], str] = {
    **{("POST", f"/organization/{verb}"): _ORGS
       for verb in ("new", "update", "delete", "member_add", "member_update",
                    "member_delete")},
    ("GET", "/organization/info"): _ORGS,
    ("POST", "/organization/info"): _ORGS,
    ("GET", "/organization/list"): _ORGS,
    ("GET", "/sso/key/generate"): _SSO,
    ("GET", "/sso/callback"): _SSO,
    ("POST", "/login"): _SSO,
    ("POST", "/v2/login"): _SSO,
    ("POST", "/guardrails"): _GUARDRAILS,
    ("POST", "/apply_guardrail"): _GUARDRAILS,
    ("POST", "/guardrails/apply_guardrail"): _GUARDRAILS,
    ("POST", "/model/new"): _MODELS,
    ("POST", "/model/update"): _MODELS,
    ("POST", "/model/delete"): _MODELS,
    ("PATCH", "/model/update"): _MODELS,
    ("GET", "/routes"): _ROUTES,
    ("GET", "/settings"): _CONFIG,
    ("GET", "/get/config/callbacks"): _CONFIG,
    ("GET", "/config/yaml"): _CONFIG,
    ("GET", "/config/list"): _CONFIG,
    ("GET", "/config/field/info"): _CONFIG,
    ("POST", "/config/update"): _CONFIG,
    ("POST", "/config/field/update"): _CONFIG,
    ("POST", "/config/field/delete"): _CONFIG,
    ("POST", "/config/callback/delete"): _CONFIG,
    **{(method, f"{v1}{path}"): what for (method, path), what in _OPENAI_PATHS.items()
       for v1 in ("/v1", "")},
}


def refuse(what: str) -> Handler:
    """A handler answering that triogate does not have ``what`` (whatever the key)."""

    async def refuse(services: Services, request: Request) -> Response:
        await trio.lowlevel.checkpoint()
        raise ApiError(400, f"triogate does not have {what} (see docs/litellm-admin.md, "
                       "'Unsupported LiteLLM routes')", "invalid_request_error",
                       code="unsupported_feature")

    return refuse


def routes() -> dict[tuple[str, str], Handler]:
    """Every refused route, keyed by (method, path)."""
    return {route: refuse(what) for route, what in UNSUPPORTED.items()}
