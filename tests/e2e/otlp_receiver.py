"""A tiny OTLP/HTTP receiver on loopback: records every POST to /v1/traces (JSON)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

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
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                body, buffer = buffer[:length], buffer[length:]
                if method == "POST" and path == "/v1/traces":
                    self.posts.append((path, headers, orjson.loads(body)))
                    self._note()
                await stream.send_all(
                    f"HTTP/1.1 {self.status} X\r\ncontent-type: application/json\r\n"
                    "content-length: 2\r\n\r\n{}".encode())


@asynccontextmanager
async def open_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, receiver.handle, 0,
                                                host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        receiver.url = f"http://127.0.0.1:{port}"
        try:
            yield receiver
        finally:
            nursery.cancel_scope.cancel()
