"""Calling the admin API's handlers in-process (no HTTP to ourselves).

The dashboard's changes go through exactly the code ``curl`` reaches: the same field
validation, the same SQL, the same announcements to every process. :func:`call` builds
the handler's :class:`~triogate.api.http.Request` in memory with the master key (the
dashboard has already checked, through :meth:`UiPrincipal.can`, that the person may do
it) and hands back the decoded JSON, or a :class:`UiError` with the API's message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import orjson

from triogate.api.admin.routes import routes as admin_routes
from triogate.api.errors import ApiError
from triogate.api.http import Request

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from triogate.api.http import Response
    from triogate.api.services import Services

    Handler = Callable[[Services, Request], Awaitable[Response]]


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


def handler_of(kind: str, verb: str) -> Handler:
    """The admin route for ``verb`` on ``kind`` ("keys", "teams", ...), behind the same
    role rule the HTTP API applies."""
    return admin_routes()[_route(kind, verb)]


def _request(services: Services, method: str, path: str, query: Mapping[str, str],
             body: bytes) -> Request:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    master = services.config.master_key
    if master is not None:
        headers.append((b"authorization", b"Bearer " + master.encode()))
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


async def call(services: Services, kind: str, verb: str, *,
               query: Mapping[str, str] | None = None,
               body: Mapping[str, Any] | None = None) -> Any:
    """Run the admin handler for ``verb`` on ``kind``; its JSON body. A checkpoint.

    Raises:
        UiError: the API refused (400, 404, 409, 503...), with its message.
    """
    method, path = _route(kind, verb)
    raw = orjson.dumps(dict(body)) if body is not None else b""
    request = _request(services, method, path, query or {}, raw)
    try:
        response = await handler_of(kind, verb)(services, request)
    except ApiError as exc:
        raise UiError(exc.status, exc.message) from None
    return orjson.loads(response.body)
