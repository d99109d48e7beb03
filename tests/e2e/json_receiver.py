"""A tiny JSON-over-HTTP service on loopback for tests: records every POST and answers
with what its ``answer`` function returns (a budget-alert webhook, a guardrail service)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs
import orjson
import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable


async def read_request(stream: trio.SocketStream, buffer: bytes
                       ) -> tuple[str, str, dict[str, str], bytes, bytes] | None:
    """The next HTTP/1.1 request on ``stream`` after what ``buffer`` holds already:
    method, path, headers (lower-case names), body and the bytes read past it; None
    once the client closes."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    head, _, buffer = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(buffer) < length:
        buffer += await stream.receive_some(65536)
    return method, path, headers, buffer[:length], buffer[length:]


def _ok(path: str, body: Any) -> tuple[int, Any]:
    return 200, {}


@attrs.define
class JsonService:
    """``posts``: (path, headers, body) of every POST, in arrival order."""

    answer: Callable[[str, Any], tuple[int, Any]] = _ok
    url: str = ""
    posts: list[tuple[str, dict[str, str], Any]] = attrs.Factory(list)
    _changed: trio.Event = attrs.Factory(trio.Event)

    async def wait_for(self, predicate: Callable[[JsonService], bool], timeout_s: float = 10
                       ) -> None:
        with trio.fail_after(timeout_s):
            while not predicate(self):
                await self._changed.wait()

    def bodies(self) -> list[Any]:
        return [body for _, _, body in self.posts]

    async def handle(self, stream: trio.SocketStream) -> None:
        buffer = b""
        async with stream:
            while True:
                if (request := await read_request(stream, buffer)) is None:
                    return
                method, path, headers, raw, buffer = request
                body = orjson.loads(raw) if raw else None
                if method == "POST":
                    self.posts.append((path, headers, body))
                    self._changed.set()
                    self._changed = trio.Event()
                status, answer = self.answer(path, body)
                data = orjson.dumps(answer)
                await stream.send_all(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(data)}\r\n\r\n".encode() + data)


class _Handler(Protocol):
    url: str

    async def handle(self, stream: trio.SocketStream) -> None: ...


Service = TypeVar("Service", bound=_Handler)


@asynccontextmanager
async def on_loopback(service: Service) -> AsyncIterator[Service]:
    """``service.handle`` serving connections on a free loopback port (``service.url``)
    in a nursery of the caller's task; stopped on exit."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, service.handle, 0,
                                                host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        service.url = f"http://127.0.0.1:{port}"
        try:
            yield service
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_json_service(answer: Callable[[str, Any], tuple[int, Any]] = _ok
                            ) -> AsyncIterator[JsonService]:
    async with on_loopback(JsonService(answer)) as service:
        yield service
