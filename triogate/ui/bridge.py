"""Calling the admin API's handlers in-process (no HTTP to ourselves).

The dashboard's changes go through exactly the code ``curl`` reaches: the same field
validation, the same SQL, the same announcements to every process, and the same role
rules. :func:`call` builds the handler's :class:`~triogate.api.http.Request` in memory,
applies the route's rule (``roles.RULES``) to the signed-in person's
:class:`~triogate.api.admin.roles.Caller` (what their key would be over HTTP), runs the
handler as that caller (which narrows by ownership: a team admin's keys are its teams'),
and hands back the decoded JSON, or a :class:`UiError` with the API's message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import orjson

from triogate.api.admin import roles
from triogate.api.admin.roles import RULES, Caller
from triogate.api.admin.routes import handlers_by_route
from triogate.api.errors import ApiError
from triogate.api.http import Request

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from triogate.api.http import Response
    from triogate.api.services import Services

    AdminHandler = Callable[[Services, Request, Caller], Awaitable[Response]]


class UiError(Exception):
    """An admin call the API refused; ``message`` is the API's own (safe to show)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


#: The dashboard's entity kinds → the admin API's path prefix.
PREFIXES: Mapping[str, str] = {"keys": "/key", "teams": "/team", "users": "/user",
                               "customers": "/customer", "tags": "/tag"}
#: Admin routes whose verb differs from the dashboard's.
_VERBS: Mapping[tuple[str, str], str] = {("keys", "new"): "generate"}


def _route(kind: str, verb: str) -> tuple[str, str]:
    method = "GET" if verb in ("info", "list") else "POST"
    return method, f"{PREFIXES[kind]}/{_VERBS.get((kind, verb), verb)}"


def handler_of(kind: str, verb: str) -> AdminHandler:
    """The admin handler for ``verb`` on ``kind`` ("keys", "teams", ...), unguarded."""
    return handlers_by_route()[_route(kind, verb)]


def allowed(caller: Caller, kind: str, verb: str) -> bool:
    """Whether the route's rule lets ``caller``'s role call it (as ``roles.authorize``)."""
    rule = RULES[_route(kind, verb)]
    return caller.role in rule.roles or (roles.TEAM_ADMIN in rule.roles
                                         and bool(caller.admin_of))


def _request(services: Services, method: str, path: str, query: Mapping[str, str],
             body: bytes) -> Request:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": path, "headers": headers,
             "query_string": urlencode(dict(query)).encode()}
    return Request(scope, receive, "ui")


async def call(services: Services, kind: str, verb: str, *, caller: Caller,
               query: Mapping[str, str] | None = None,
               body: Mapping[str, Any] | None = None) -> Any:
    """Run the admin handler for ``verb`` on ``kind`` as ``caller``; its JSON body.
    A checkpoint.

    Raises:
        UiError: the API refused (400, 403, 404, 409, 503...), with its message.
    """
    if not allowed(caller, kind, verb):
        raise UiError(403, f"your role ({caller.role}) may not do this")
    method, path = _route(kind, verb)
    raw = orjson.dumps(dict(body)) if body is not None else b""
    request = _request(services, method, path, query or {}, raw)
    try:
        response = await handler_of(kind, verb)(services, request, caller)
    except ApiError as exc:
        raise UiError(exc.status, exc.message) from None
    return orjson.loads(response.body)
