"""The raw ASGI request and response objects (no framework: its cost per request is not free).

A :class:`Request` reads its body with a size limit; a :class:`Response` sends a whole
body; a :class:`StreamResponse` sends chunks from an async iterator while a watcher
listens for ``http.disconnect`` and cancels the stream when the client goes away, so the
stream's ``finally`` (settlement) runs at once instead of at the next write.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, final
from urllib.parse import parse_qsl

import orjson
import trio

from triogate.api.errors import ApiError
from triogate.api.validate import MAX_DEPTH, check_depth

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    Send = Callable[[dict[str, Any]], Awaitable[None]]
    Receive = Callable[[], Awaitable[dict[str, Any]]]


def new_request_id() -> str:
    """A fresh request id: 128 random bits as 32 hex digits. What ``uuid4().hex`` gives,
    less its six fixed bits, in a fifth of its time (it builds a UUID and an int first):
    every request without an id of its own draws one."""
    return os.urandom(16).hex()


def json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` parsed as a JSON object; 400 with a precise message otherwise."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "request body must be a JSON object")
    # Fewer brackets than the limit cannot nest past it: most bodies skip the walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        check_depth(value)
    return value


@final
class Request:
    """An HTTP request as the ASGI server handed it over."""

    def __init__(self, scope: Mapping[str, Any], receive: Receive, request_id: str) -> None:
        self.scope = scope
        self.receive = receive
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[str, str] = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
        }
        query = scope.get("query_string", b"")
        self.query: dict[str, str] = dict(parse_qsl(query.decode())) if query else {}
        self.request_id = request_id
        #: The model flow's unique id (``calls.trace_id_of``), once chosen.
        self.trace_id: str | None = None
        #: Redis waits spent on this request before admission (a caller's alias lookup).
        self.waits_before_admission = 0
        self.started_at = trio.current_time()
        #: Settlements handed to a response that settles once it is sent
        #: (``flow.SettledAfter``); the ASGI layer runs any still due when the request
        #: ends, so a response dropped before its send (an error after the handler
        #: returned) still settles. Each settles once whoever calls it.
        self.unsettled: list[Callable[[], None]] = []
        #: Whether the model flow may read ``receive`` to notice the client leaving (one
        #: reader per connection: the parts of a multi-model call share their parent's).
        self.watch_disconnect = True
        #: Set once the caller's key has been checked (admission or auth_first).
        self.authenticated = False
        #: The body :meth:`json` parsed (a second call answers it: the body is read once).
        self._json: dict[str, Any] | None = None

    async def body(self, max_bytes: int) -> bytes:
        """The whole body, refused with 413 past ``max_bytes`` (before reading it all)."""
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise ApiError(413, f"request body exceeds {max_bytes} bytes", "request_too_large")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                raise ApiError(413, f"request body exceeds {max_bytes} bytes", "request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def json(self, max_bytes: int) -> dict[str, Any]:
        """The body parsed as a JSON object; 400 with a precise message otherwise.

        A second call answers the same object (without a checkpoint)."""
        if self._json is not None:
            return self._json
        raw = await self.body(max_bytes)
        if not raw:
            raise ApiError(400, "request body is empty; expected a JSON object")
        self._json = json_object(raw)
        return self._json

    def bearer(self) -> str | None:
        """The key from ``Authorization: Bearer …``, ``x-api-key`` or Azure's ``api-key``."""
        auth = self.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        return self.headers.get("x-api-key") or self.headers.get("api-key") or None


class ClientGone(Exception):
    """Raised by :meth:`Request.body` when the client disconnected mid-body."""


class Response:
    """A complete response."""

    def __init__(
        self,
        body: bytes,
        *,
        status: int = 200,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.body = body
        self.status = status
        self.headers: dict[str, str] = {"content-type": content_type, **(headers or {})}

    @classmethod
    def json(cls, value: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
             ) -> Response:
        return cls(orjson.dumps(value), status=status, headers=headers)

    def _start(self, *, length: bool = True) -> dict[str, Any]:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        if length:  # a complete body: no chunked encoding
            headers.append((b"content-length", str(len(self.body)).encode()))
        return {"type": "http.response.start", "status": self.status, "headers": headers}

    async def send(self, send: Send, receive: Receive, *, head: bool = False) -> None:
        """Send status, headers and body (no body for a ``HEAD`` request)."""
        await send(self._start())
        await send({"type": "http.response.body", "body": b"" if head else self.body,
                    "more_body": False})


class StreamResponse(Response):
    """A streamed response (SSE).

    ``produce(write)`` writes the chunks itself; it runs in the handler's task, inside a
    nursery whose watcher cancels it when the client disconnects, so its ``finally``
    (settlement) runs at once. No async generator holds a cancel scope across a yield.
    """

    def __init__(
        self,
        produce: Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]],
        *,
        status: int = 200,
        content_type: str = "text/event-stream",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(b"", status=status, content_type=content_type, headers={
            "cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})})
        self.produce = produce
        self.disconnected = False

    async def send(self, send: Send, receive: Receive, *, head: bool = False) -> None:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.disconnected = True
                nursery.cancel_scope.cancel()

            started = False

            async def write(chunk: bytes) -> None:
                nonlocal started
                if not started:
                    started = True
                    await send(self._start(length=False))
                await send({"type": "http.response.body", "body": chunk, "more_body": True})

            nursery.start_soon(watch)
            # ``produce`` owns the request's settlement: it must run even when the client
            # is already gone, so the status line goes out with its first write.
            await self.produce(write)
            if not started:
                await write(b"")
            # Stop watching BEFORE the last send: ending the response lets the server
            # recycle the connection and answer the watcher's receive() with
            # http.disconnect; the watcher must not outlive the response it watched.
            nursery.cancel_scope.cancel()
        if not self.disconnected:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
