"""The ASGI callable: route, run the handler, render errors in the route's API shape.

Every response carries ``x-request-id`` (the client's, if it sent a sane one). An
exception that is not an :class:`ApiError` is a bug: it is logged with the request id
and the client gets a 500 in its API's shape, never a stack trace.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import TYPE_CHECKING, Any

from triogate._log import request_id_var
from triogate.api import routes
from triogate.api.errors import ApiError, render
from triogate.api.http import ClientGone, Request, Response

if TYPE_CHECKING:
    from triogate.api.http import Receive, Send
    from triogate.api.services import Services

logger = logging.getLogger("triogate.api")

_SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


#: Paths never refused for overload: probes and scrapes must answer when it matters most.
_ALWAYS_SERVED = ("/health", "/metrics")


class GatewayASGI:
    """The gateway as an ASGI 3 application.

    At most ``triogate.max_in_flight`` requests are served at once (per worker); one more
    is refused at once with 503 and ``Retry-After`` in its API's error shape, so that the
    admitted ones keep their latency instead of all queueing (:attr:`refused` counts them).
    """

    def __init__(self, services: Services) -> None:
        self.services = services
        self.max_in_flight = services.config.settings.max_in_flight
        self.in_flight = 0
        self.refused = 0
        self.routes = routes.table()
        self._paths: dict[str, list[str]] = {}
        for method, path in self.routes:
            self._paths.setdefault(path, []).append(method)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        limit = self.max_in_flight
        if not limit or scope["path"].startswith(_ALWAYS_SERVED):
            await self._serve(scope, receive, send)
            return
        if self.in_flight >= limit:
            self.refused += 1
            await _overloaded(scope["path"]).send(send, receive)
            return
        self.in_flight += 1
        try:
            await self._serve(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _serve(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        client_id = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = client_id if _SANE_ID.match(client_id) else uuid.uuid4().hex
        token = request_id_var.set(request_id)
        try:
            request = Request(scope, receive, request_id)
            route = self.routes.get((request.method, request.path))
            style = route.style if route else "openai"
            try:
                if route is None:
                    response = self._no_route(request)
                else:
                    response = await route.handler(self.services, request)
            except ApiError as exc:
                response = _error_response(exc, style)
            except ClientGone:
                return
            except Exception:
                logger.exception("unhandled error", extra={"path": request.path})
                response = _error_response(
                    ApiError(500, f"internal error (request id {request_id})", "api_error"), style
                )
            response.headers.setdefault("x-request-id", request_id)
            await response.send(send, receive)
        finally:
            request_id_var.reset(token)

    def _no_route(self, request: Request) -> Response:
        methods = self._paths.get(request.path)
        if methods:
            raise ApiError(405, f"method {request.method} not allowed on {request.path}",
                           headers={"allow": ", ".join(sorted(methods))})
        raise ApiError(404, f"no route {request.method} {request.path}", "not_found_error")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        # The app nursery is owned by app.serve, outside hypercorn: nothing to start here.
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def _overloaded(path: str) -> Response:
    style = "anthropic" if path.endswith("/messages") else "openai"
    error = ApiError(503, "the gateway is at its limit of requests in flight; retry shortly",
                     "overloaded_error" if style == "anthropic" else "service_unavailable",
                     code="overloaded", headers={"retry-after": "1"})
    return _error_response(error, style)


def _error_response(exc: ApiError, style: str) -> Response:
    return Response(render(exc, style), status=exc.status,  # type: ignore[arg-type]
                    headers=exc.headers)
