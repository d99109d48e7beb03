"""LiteLLM routes for features triogate leaves out, answered with a 400 that says so.

Organizations, SSO / UI login, guardrails over the API and runtime model management (``/model/new``
and friends) are not part of triogate. A LiteLLM script that calls them gets a 400 in
OpenAI's error shape (``code: unsupported_feature``) naming what is missing and what to
use instead, never a 404 that could pass for a typo or a success that did nothing. The
caller is authenticated first (a wrong key is a 401, as on every route), so the answer
tells an anonymous caller nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.api.admin.roles import resolve_caller
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
_GUARDRAILS = ("guardrails over the API: configure them in the config file's guardrails: "
               "(docs/governance-features.md)")
_MODELS = ("runtime model management: deployments come from the config file's model_list "
           "(restart, or roll the processes, to change them)")

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
    ("GET", "/guardrails/list"): _GUARDRAILS,
    ("GET", "/v2/guardrails/list"): _GUARDRAILS,
    ("POST", "/guardrails"): _GUARDRAILS,
    ("POST", "/apply_guardrail"): _GUARDRAILS,
    ("POST", "/guardrails/apply_guardrail"): _GUARDRAILS,
    ("POST", "/model/new"): _MODELS,
    ("POST", "/model/update"): _MODELS,
    ("POST", "/model/delete"): _MODELS,
    ("PATCH", "/model/update"): _MODELS,
}


def _refuse(what: str) -> Handler:
    async def refuse(services: Services, request: Request) -> Response:
        await resolve_caller(services, request)  # 401 first, as everywhere
        raise ApiError(400, f"triogate does not have {what} (see the README's 'Migrating "
                       "from LiteLLM')", "invalid_request_error", code="unsupported_feature")

    return refuse


def routes() -> dict[tuple[str, str], Handler]:
    """Every refused route, keyed by (method, path)."""
    return {route: _refuse(what) for route, what in UNSUPPORTED.items()}
