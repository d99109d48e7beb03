"""A tiny OTLP/HTTP receiver on loopback: records every POST to /v1/traces (JSON)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from tests.e2e.json_receiver import on_loopback, read_request

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@attrs.define
class Receiver:
    url: str = ""
    posts: list[tuple[str, dict[str, str], dict[str, Any]]] = attrs.Factory(list)
    status: int = 200
    _changed: trio.Event = attrs.Factory(trio.Event)

    def spans(self) -> list[dict[str, Any]]:
        return [span for _, _, body in self.posts for rs in body["resourceSpans"]
                for ss in rs["scopeSpans"] for span in ss["spans"]]

    async def wait_for(self, predicate: Any) -> None:
        while not predicate(self):
            await self._changed.wait()

    def _note(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        buffer = b""
        async with stream:
            while True:
                if (request := await read_request(stream, buffer)) is None:
                    return
                method, path, headers, body, buffer = request
                if method == "POST" and path == "/v1/traces":
                    self.posts.append((path, headers, orjson.loads(body)))
                    self._note()
                await stream.send_all(
                    f"HTTP/1.1 {self.status} X\r\ncontent-type: application/json\r\n"
                    "content-length: 2\r\n\r\n{}".encode())


@asynccontextmanager
async def open_receiver() -> AsyncIterator[Receiver]:
    async with on_loopback(Receiver()) as receiver:
        yield receiver
