"""What every fake upstream's ASGI app does the same way: lifespan, body, JSON, serving.

The fakes (``fakeupstream``, ``fakeazure``, ``fakebedrock``, ``fakegemini``) differ in
the wire format they speak; how they are served over hypercorn, how they read a request
body, answer JSON or stream server-sent events, and how ``python -m`` runs them, is the
same, and lives here.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    Scope = dict[str, Any]
    Receive = Callable[[], Awaitable[dict[str, Any]]]
    Send = Callable[[dict[str, Any]], Awaitable[None]]


class Served(Protocol):
    """An ASGI app that learns the address it is served on."""

    base_url: str

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...


App = TypeVar("App", bound=Served)


async def answer_lifespan(receive: Receive, send: Send) -> None:
    """Complete every lifespan message until shutdown."""
    while True:
        message = await receive()
        kind = message["type"].removeprefix("lifespan.")
        await send({"type": f"lifespan.{kind}.complete"})
        if kind == "shutdown":
            return


async def read_body(receive: Receive) -> bytes:
    """The whole request body, however many messages it came in."""
    body: bytes = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def http_body(scope: Scope, receive: Receive, send: Send) -> bytes | None:
    """The body of an HTTP request; None once a lifespan is answered or for other scopes."""
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return None
    if scope["type"] != "http":
        return None
    return await read_body(receive)


async def send_json(
    send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer ``body`` as JSON with ``status`` and any extra ``headers``."""
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def send_events(send: Send, receive: Receive, events: list[bytes], delay_s: float,
                      headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Stream ``events`` ``delay_s`` apart; stop early when the client goes away.

    ``headers`` default to a ``text/event-stream`` content type.
    """
    async with trio.open_nursery() as nursery:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        await send({"type": "http.response.start", "status": 200,
                    "headers": headers or [(b"content-type", b"text/event-stream")]})
        for count, data in enumerate(events):
            if count and delay_s:
                await trio.sleep(delay_s)
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        nursery.cancel_scope.cancel()


def hypercorn_config(host: str, port: int) -> Config:
    """Hypercorn settings for a fake: no access log, a deep backlog, long keep-alive."""
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.backlog = 1024
    config.keep_alive_timeout = 75.0
    return config


def origin_form(app: Served) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """``app`` given the path of an absolute-form request target as well.

    A server must accept ``POST http://host:port/path`` (RFC 9112, section 3.2.2), which a
    client sends through a forwarding proxy; hypercorn hands it on whole as the path.
    """
    async def app_of_origin_form(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and "://" in path:
            rest = path.split("://", 1)[1]
            origin_path = "/" + rest.split("/", 1)[1] if "/" in rest else "/"
            raw = scope.get("raw_path") or path.encode()
            raw_rest = raw.split(b"://", 1)[1]
            scope = {**scope, "path": origin_path,
                     "raw_path": b"/" + raw_rest.split(b"/", 1)[1] if b"/" in raw_rest
                     else b"/"}
        await app(scope, receive, send)

    return app_of_origin_form


@contextlib.asynccontextmanager
async def serving(app: App, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[App]:
    """Serve ``app`` in a nursery of the caller's task, set its ``base_url``; stop on exit.
    Absolute-form request targets (from a forwarding proxy) reach it in origin form."""
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, origin_form(app), hypercorn_config(host, port))
        app.base_url = binds[0]
        try:
            yield app
        finally:
            nursery.cancel_scope.cancel()


def serve_main(
    description: str,
    open_fake: Callable[..., contextlib.AbstractAsyncContextManager[Served]],
    argv: list[str] | None = None,
) -> None:
    """``python -m`` for a fake: serve on ``--host``/``--port``, print its URL, run until Ctrl-C."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    async def run() -> None:
        async with open_fake(args.host, args.port, record_requests=False) as fake:
            print(fake.base_url, flush=True)
            await trio.sleep_forever()

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)
    sys.exit(0)
