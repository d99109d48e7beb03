"""The ASGI callable: route, run the handler, render errors in the route's API shape.

Every response carries ``x-request-id`` (the client's, if it sent a sane one). An
exception that is not an :class:`ApiError` is a bug: it is logged with the request id
and the client gets a 500 in its API's shape, never a stack trace.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from triogate._log import request_id_var
from triogate.api import routes
from triogate.api.errors import ApiError, render
from triogate.api.http import ClientGone, Request, Response, new_request_id

if TYPE_CHECKING:
    from triogate.api.http import Receive, Send
    from triogate.api.services import Services

logger = logging.getLogger("triogate.api")

_SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
#: Request headers a browser may send (preflight), and response headers it may read.
_ALLOWED_HEADERS = ("authorization, content-type, x-api-key, anthropic-version, "
                    "anthropic-beta, openai-organization, x-request-id, x-end-user-id")
_EXPOSED = ("x-request-id, retry-after, x-ratelimit-remaining-requests, "
            "x-ratelimit-remaining-tokens, x-ratelimit-limit-requests, "
            "x-ratelimit-limit-tokens, x-triogate-cache")


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
        #: Why the master key is unfit for a public address (``triogate.asgi`` refuses
        #: requests that arrive on one); None when it is fit, or the server checked it.
        self.insecure: str | None = None
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
        request = Request(scope, receive, "")
        client_id = request.headers.get("x-request-id", "")
        request_id = client_id if _SANE_ID.match(client_id) else new_request_id()
        request.request_id = request_id
        token = request_id_var.set(request_id)
        try:
            head = request.method == "HEAD"
            # HEAD is GET without the body, wherever GET exists.
            route = routes.find(self.routes, "GET" if head else request.method,
                                request.path)
            style = route.style if route else "openai"
            try:
                if request.method == "OPTIONS" and request.path in self._paths:
                    response = self._preflight(request)
                elif route is None:
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
            response.headers.update(self._cors(request))
            await response.send(send, receive, head=head)
        finally:
            request_id_var.reset(token)

    def _methods(self, path: str) -> list[str]:
        methods = set(self._paths.get(path, ()))
        if "GET" in methods:
            methods.add("HEAD")
        return sorted(methods | {"OPTIONS"})

    def _cors(self, request: Request) -> dict[str, str]:
        """CORS headers for a request from an allowed browser origin (none otherwise)."""
        origin = request.headers.get("origin")
        allowed = self.services.config.settings.http.cors_allow_origins
        if not origin or not (origin in allowed or "*" in allowed):
            return {}
        return {
            "access-control-allow-origin": origin,
            "vary": "origin",
            "access-control-expose-headers": _EXPOSED,
        }

    def _preflight(self, request: Request) -> Response:
        """``OPTIONS``: the allowed methods; for an allowed origin, CORS's preflight answer."""
        methods = ", ".join(self._methods(request.path))
        headers = {"allow": methods}
        if self._cors(request):
            asked = request.headers.get("access-control-request-headers")
            headers.update({
                "access-control-allow-methods": methods,
                "access-control-allow-headers": asked or _ALLOWED_HEADERS,
                "access-control-max-age": str(self.services.config.settings.http.cors_max_age_s),
            })
        return Response(b"", status=204, content_type="text/plain", headers=headers)

    def _no_route(self, request: Request) -> Response:
        methods = self._paths.get(request.path)
        if methods:
            raise ApiError(405, f"method {request.method} not allowed on {request.path}",
                           headers={"allow": ", ".join(self._methods(request.path))})
        raise ApiError(404, f"no route {request.method} {request.path}", "not_found_error")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        # The app nursery is owned by app.serve, outside the server: nothing to start here
        # (triogate.server does not run lifespan; an ASGI server that does finds it answered).
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def _overloaded(path: str) -> Response:
    """503 for a request beyond ``max_in_flight``, and the connection closed after it.

    Closing is the load-shedding half: a client that retries at once on a kept-alive
    connection (wrk, a retry loop) came straight back, every refused connection's task was
    runnable on every pass of the run loop, and at 4,096 connections the worker spent its
    CPU refusing (12,000 refusals a second, admitted requests' p99 10 s). A closed
    connection comes back through the accept loop, a batch per pass, so admitted requests
    keep their share (Envoy's overload manager disables keep-alive for the same reason).
    """
    style = "anthropic" if path.endswith("/messages") else "openai"
    error = ApiError(503, "the gateway is at its limit of requests in flight; retry shortly",
                     "overloaded_error" if style == "anthropic" else "service_unavailable",
                     code="overloaded", headers={"retry-after": "1", "connection": "close"})
    return _error_response(error, style)


def _error_response(exc: ApiError, style: str) -> Response:
    return Response(render(exc, style), status=exc.status,  # type: ignore[arg-type]
                    headers=exc.headers)
