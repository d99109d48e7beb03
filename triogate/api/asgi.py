"""The ASGI callable: route, run the handler, render errors in the route's API shape.

Every response carries ``x-request-id`` (the client's, if it sent a sane one). An
exception that is not an :class:`ApiError` is a bug: it is logged with the request id
and the client gets a 500 in its API's shape, never a stack trace.

A request with a body is judged on its head before the body is read: without any key
(where keys are needed) it is refused 401 at once, unread; with a key memory knows to be
invalid, 401 too. A key memory cannot vouch for (not the master key, not a virtual key
held fresh) has its body read here, before it takes a ``max_in_flight`` slot: at most
``triogate.http.max_unauthenticated_bodies`` such bodies are read at once (the others
wait their turn, in arrival order), and the wait and the read together are bounded by
``triogate.http.max_body_read_s`` (503 if the turn never came, 408 if the body did not)
and ``max_body_bytes`` (413). Clients trickling bodies without a valid key cannot hold
the slots the gateway's work needs, and a burst of requests for a key not yet in memory
is read a bound's worth at a time.
"""

from __future__ import annotations

import hmac
import logging
import re
from typing import TYPE_CHECKING, Any, Final

import trio

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
#: Paths that authenticate otherwise (the dashboard: a session cookie, a sign-in form).
_OWN_AUTH = ("/ui",)
#: What the head says of the caller (``_judge``): known good, or to be read first.
_VOUCHED: Final = 0
_UNVOUCHED: Final = 1


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
        settings = services.config.settings
        #: Turns to read the body of a key memory cannot vouch for.
        self.unvouched = trio.CapacityLimiter(settings.http.max_unauthenticated_bodies)
        self._max_body = settings.max_body_bytes
        self._body_time_s = settings.http.max_body_read_s
        master = services.config.master_key
        self._master = master.encode() if master is not None else None
        self._open = master is None and services.identities is None
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
        path = scope["path"]
        if path.startswith(_ALWAYS_SERVED):
            await self._serve(scope, receive, send)
            return
        verdict = self._judge(scope)
        if isinstance(verdict, ApiError):
            await self._refuse(scope, receive, send, verdict)
            return
        if verdict == _UNVOUCHED:
            try:
                body = await self._read_unvouched(receive)
            except ApiError as exc:
                if exc.status == 503:
                    self.refused += 1
                    await _overloaded(path).send(send, receive)
                else:
                    await self._refuse(scope, receive, send, exc)
                return
            except ClientGone:
                return
            receive = _Replay(body, receive)
        limit = self.max_in_flight
        if not limit:
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

    def _judge(self, scope: dict[str, Any]) -> int | ApiError:
        """The caller as its head tells: vouched for (or no body to wait for), to be read
        first (a key only Redis can check), or refused (no key, or one known invalid)."""
        if self._open or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return _VOUCHED
        # HTTP/1 frames a body by its headers; an HTTP/2 stream may carry one without them.
        has_body = scope.get("http_version") == "2"
        key = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                has_body = value.strip() not in (b"0", b"")
            elif name == b"transfer-encoding":
                has_body = True
            elif name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and token.strip():
                    key = token.strip()
            elif name in (b"x-api-key", b"api-key") and key is None and value:
                key = value
        if (not has_body or scope["path"].startswith(_OWN_AUTH)
                or routes.refused_for_every_caller(scope["method"], scope["path"])):
            return _VOUCHED
        if key is None:
            return ApiError(401, "missing API key: send 'Authorization: Bearer <key>' or "
                                 "'x-api-key: <key>'", "authentication_error",
                            code="missing_key")
        if self._master is not None and hmac.compare_digest(key, self._master):
            return _VOUCHED
        identities = self.services.identities
        known = identities.known(key.decode("latin-1")) if identities is not None else False
        if known is False:
            return ApiError(401, "invalid API key", "authentication_error", code="invalid_key")
        return _VOUCHED if known else _UNVOUCHED

    async def _read_unvouched(self, receive: Receive) -> bytes:
        """The whole body, read in its turn (see the module docstring for the bounds).

        Raises:
            ApiError: 503 when no turn came, 408 when the body did not, within
                ``max_body_read_s``; 413 past ``max_body_bytes``.
            ClientGone: the client left.
        """
        chunks: list[bytes] = []
        size = 0
        limit = self._max_body
        turn = False
        with trio.move_on_after(self._body_time_s):
            async with self.unvouched:
                turn = True
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ClientGone()
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise ApiError(413, f"request body exceeds {limit} bytes",
                                       "request_too_large")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        if not turn:
            raise ApiError(503, "too many request bodies being read for keys not yet checked")
        raise ApiError(408, f"request body not received within {self._body_time_s:g} s",
                       "timeout_error")

    async def _refuse(self, scope: dict[str, Any], receive: Receive, send: Send,
                      error: ApiError) -> None:
        """``error`` for a request refused before its handler ran; its connection closes
        when its body was not read."""
        request = Request(scope, receive, "")
        client_id = request.headers.get("x-request-id", "")
        error.headers.setdefault("connection", "close")
        response = _error_response(error, "anthropic" if request.path.endswith("/messages")
                                   else "openai")
        response.headers["x-request-id"] = (client_id if _SANE_ID.match(client_id)
                                            else new_request_id())
        response.headers.update(self._cors(request))
        await response.send(send, receive)

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
            # A settlement handed to a response that was never sent (an error after the
            # handler returned it) runs here: no request leaves a reservation behind.
            for settle in request.unsettled:
                settle()
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


class _Replay:
    """``receive`` for a handler whose body was read already: the body, then the server's."""

    def __init__(self, body: bytes, receive: Receive) -> None:
        self._body: bytes | None = body
        self._receive = receive

    async def __call__(self) -> dict[str, Any]:
        body = self._body
        if body is None:
            return await self._receive()
        self._body = None
        await trio.lowlevel.checkpoint()
        return {"type": "http.request", "body": body, "more_body": False}


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
