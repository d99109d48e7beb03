"""``triogate.asgi``'s application driven through ASGI itself, as any server drives it: its
lifespan starts and drains the gateway, requests reach it through the lifespan state, a
startup failure is one message, and the bind check refuses a public address with the
example master key."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from tests.e2e.conftest import gateway_config
from triogate.app import EXAMPLE_MASTER_KEY
from triogate.asgi import GatewayApp, create_app
from triogate.redis_server import lock_state_folder

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


class Lifespan:
    """The server's half of the lifespan protocol, run in a task."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self.to_app, self.app_receives = trio.open_memory_channel[dict[str, Any]](4)
        self.sent: list[dict[str, Any]] = []
        self.answered = trio.Event()

    async def run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        await self.app(scope, self.app_receives.receive, self._send)

    async def _send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        self.answered.set()

    async def ask(self, kind: str) -> str:
        self.answered = trio.Event()
        await self.to_app.send({"type": f"lifespan.{kind}"})
        with trio.fail_after(30):
            await self.answered.wait()
        return str(self.sent[-1]["type"])


async def request(app: GatewayApp, state: dict[str, Any] | None, path: str, *,
                  server: tuple[str, int] = ("127.0.0.1", 4000),
                  headers: Sequence[tuple[bytes, bytes]] = ()) -> tuple[int, bytes]:
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": list(headers), "client": ("127.0.0.1", 5555),
        "server": server}
    if state is not None:
        scope["state"] = dict(state)  # a server hands each request a copy
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            return {"type": "http.request", "body": b"", "more_body": False}
        await trio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with trio.fail_after(20):
        await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(sent[0]["status"]), body


async def test_the_lifespan_runs_the_gateway_and_drains_it(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream,
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            general_settings={"master_key": EXAMPLE_MASTER_KEY})
    app = create_app(config=config, setup_logging=False)
    # Before the lifespan started (or under a server without it): 503, saying why.
    status, body = await request(app, None, "/health/liveliness")
    assert status == 503 and b"lifespan" in body
    lifespan = Lifespan(app)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lifespan.run)
        assert await lifespan.ask("startup") == "lifespan.startup.complete"
        status, body = await request(app, lifespan.state, "/health/liveliness")
        assert (status, orjson.loads(body)) == (200, {"status": "alive"})
        auth = [(b"authorization", b"Bearer " + EXAMPLE_MASTER_KEY.encode())]
        status, body = await request(app, lifespan.state, "/v1/models", headers=auth)
        assert status == 200 and orjson.loads(body)["object"] == "list"
        # The example key on an address that is not loopback: refused, and says why.
        status, body = await request(app, lifespan.state, "/v1/models", headers=auth,
                                     server=("192.0.2.7", 4000))
        assert status == 503
        assert "refusing to serve on 192.0.2.7 with the example master key" in (
            orjson.loads(body)["error"]["message"])
        assert await lifespan.ask("shutdown") == "lifespan.shutdown.complete"
    assert lifespan.state == {}  # the running gateway is gone from the state


async def test_a_startup_failure_is_one_message(
    tmp_path: Path, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture,
) -> None:
    config = gateway_config(tmp_path / "state", "", upstream.base_url,
                            triogate={"redis": {"url": None}})
    held = lock_state_folder(tmp_path / "state" / "redis")  # as another gateway would
    try:
        app = create_app(config=config, setup_logging=False)
        lifespan = Lifespan(app)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lifespan.run)
            assert await lifespan.ask("startup") == "lifespan.startup.failed"
        message = lifespan.sent[-1]["message"]
        assert "is in use by another gateway" in message and "\n" not in message
        assert app.failure == message
        assert "gateway not started" in caplog.text
        assert not (tmp_path / "state" / "redis" / "redis.sock").exists()
    finally:
        os.close(held)
