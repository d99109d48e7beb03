"""A gateway started by the test, in its own trio loop, talking to real loopback servers.

The gateway runs behind its own HTTP server (``triogate``) or behind hypercorn serving
``triogate.asgi`` (``hypercorn``): the ``server`` fixture says which. A module or test
marked with :data:`BOTH_SERVERS` runs once behind each.
"""

from __future__ import annotations

import copy
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio

from triogate.app import serve, wall_clock_ms
from triogate.config import parse_config
from triogate.testing.fakeupstream import open_fake_upstream

from .scripted_upstream import Scripted

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from tests.e2e.test_admin_api import Admin
    from triogate.api.services import Services
    from triogate.batch import RespBackend
    from triogate.config import GatewayConfig
    from triogate.store.records import SpendLogRow
    from triogate.testing.fakeupstream import FakeUpstream

#: The HTTP servers the gateway runs behind.
SERVERS = ("triogate", "hypercorn")
#: Run a test (or a module, as ``pytestmark``) once behind each server.
BOTH_SERVERS = pytest.mark.parametrize("server", SERVERS)

MASTER_KEY = "sk-test-master"
UPSTREAM_KEY = "sk-upstream-secret"
MASTER_HEADERS = {"authorization": f"Bearer {MASTER_KEY}"}


def short_request(api: str, content: str) -> dict[str, Any]:
    """A five-token request body for ``/v1/chat/completions`` (``chat``) or ``/v1/messages``."""
    model = "claude-test" if api == "messages" else "gpt-test"
    return {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": content}]}


def gateway_config(
    state_dir: Path, redis_url: str, upstream_url: str, **overrides: Any
) -> GatewayConfig:
    """Two OpenAI-compatible deployments, one Anthropic, one embedding model, all on the
    fake upstream over real HTTP; tracing on. ``overrides`` are merged into the YAML."""
    raw: dict[str, Any] = {
        "model_list": [
            {"model_name": "gpt-test", "litellm_params": {
                "model": "openai/gpt-up-a", "api_base": f"{upstream_url}/v1",
                "api_key": UPSTREAM_KEY, "input_cost_per_token": "0.000001",
                "output_cost_per_token": "0.000002"}, "model_info": {"id": "gpt-a"}},
            {"model_name": "gpt-test", "litellm_params": {
                "model": "openai/gpt-up-b", "api_base": f"{upstream_url}/v1",
                "api_key": UPSTREAM_KEY, "input_cost_per_token": "0.000001",
                "output_cost_per_token": "0.000002"}, "model_info": {"id": "gpt-b"}},
            {"model_name": "claude-test", "litellm_params": {
                "model": "anthropic/claude-up", "api_base": upstream_url,
                "api_key": UPSTREAM_KEY, "input_cost_per_token": "0.000003",
                "output_cost_per_token": "0.000015"}, "model_info": {"id": "claude"}},
            {"model_name": "embed-test", "litellm_params": {
                "model": "openai/embed-up", "api_base": f"{upstream_url}/v1",
                "api_key": UPSTREAM_KEY, "input_cost_per_token": "0.0000001"},
             "model_info": {"id": "embed", "mode": "embedding"}},
        ],
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 2,
                            "allowed_fails": 3, "cooldown_time": 30},
        "general_settings": {"master_key": MASTER_KEY},
        "triogate": {"state_dir": str(state_dir), "redis": {"url": redis_url, "timeout_s": 2.0},
                     "tracing": True, "shutdown_grace_s": 5},
    }
    _merge(raw, copy.deepcopy(overrides))
    return parse_config(raw)


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


class InFlight:
    """Requests inside the application. Behind hypercorn a client can have its whole
    answer while the handler has not returned yet (its settlement not queued): a test
    waits for none to be left before it waits for the settler."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.count = 0
        self.idle = trio.Event()
        self.idle.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.count += 1
        self.idle = trio.Event() if self.idle.is_set() else self.idle
        try:
            await self.app(scope, receive, send)
        finally:
            self.count -= 1
            if not self.count:
                self.idle.set()


@attrs.frozen
class Gateway:
    """A running gateway: its base URL, its services (tracer, settler...) and its stop."""

    url: str
    services: Services
    shutdown: trio.Event
    requests: InFlight | None = None

    @property
    def openai_base(self) -> str:
        return f"{self.url}/v1"

    async def drained(self) -> None:
        """Once every request's handler returned, until the settler has nothing left."""
        if self.requests is not None:
            await self.requests.idle.wait()
        await self.services.settler.wait_drained()


@asynccontextmanager
async def running_gateway(
    config: GatewayConfig, *, clock_ms: Callable[[], int] = wall_clock_ms,
    server: str = "triogate", certfile: Path | None = None, keyfile: Path | None = None,
) -> AsyncIterator[Gateway]:
    """Serve ``config`` on 127.0.0.1 (any port) for the block behind ``server``; drain on
    exit. ``certfile``/``keyfile``: hypercorn serves TLS (``https://``)."""
    shutdown = trio.Event()
    requests = None
    async with trio.open_nursery() as nursery:
        if server == "hypercorn":
            binds, services, requests = await nursery.start(partial(
                serve_hypercorn, config, shutdown, clock_ms=clock_ms, certfile=certfile,
                keyfile=keyfile))
        else:
            binds, services = await nursery.start(
                partial(serve, config, host="127.0.0.1", port=0, shutdown=shutdown,
                        handle_signals=False, clock_ms=clock_ms)
            )
        try:
            yield Gateway(binds[0], services, shutdown, requests)
        finally:
            shutdown.set()


async def serve_hypercorn(
    config: GatewayConfig, shutdown: trio.Event, *, clock_ms: Callable[[], int],
    certfile: Path | None = None, keyfile: Path | None = None,
    task_status: trio.TaskStatus[tuple[list[str], Services, InFlight]] = (
        trio.TASK_STATUS_IGNORED),
) -> None:
    """``triogate.asgi`` under hypercorn's trio worker in this loop, with the settings
    ``triogate serve --server hypercorn`` gives it."""
    import argparse

    from hypercorn.trio import serve as hypercorn_serve

    from triogate.asgi import create_app
    from triogate.cli.hypercorn import hypercorn_config

    ready: list[Services] = []
    app = InFlight(create_app(config=config, clock_ms=clock_ms, on_ready=ready.append,
                              setup_logging=False))
    args = argparse.Namespace(host="127.0.0.1", port=0, workers=1, certfile=certfile,
                              keyfile=keyfile)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(
            hypercorn_serve, app, hypercorn_config(args, config),  # type: ignore[arg-type]
            shutdown_trigger=shutdown.wait))
        task_status.started((binds, ready[0], app))


@pytest.fixture
def server() -> str:
    """The HTTP server of the ``gateway`` fixture (:data:`BOTH_SERVERS` parametrises it)."""
    return "triogate"


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with open_fake_upstream() as fake:
        yield fake


@pytest.fixture
async def gateway(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream, server: str
) -> AsyncIterator[Gateway]:
    """The default test gateway (fresh Redis database, state in tmp_path), behind ``server``."""
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url)
    with trio.fail_after(60):
        async with running_gateway(config, server=server) as gw:
            yield gw


@pytest.fixture
async def api(gateway: Gateway) -> AsyncIterator[Admin]:
    """The admin API of the module's ``gateway``, with the master key."""
    from tests.e2e.test_admin_api import admin_client  # it imports this module

    async with admin_client(gateway) as client:
        yield client


async def traced_waits(gateway: Gateway, response: Any) -> Any:
    """The tracer's summary of ``response``'s request, once the settler has drained (so the
    post-call wait is counted). Asserts the response was a 200 first."""
    assert response.status_code == 200, response.text
    with trio.fail_after(10):
        await gateway.drained()
    assert gateway.services.tracer is not None
    return gateway.services.tracer.summary(response.headers["x-triogate-trace-id"])


async def streamed(url: str, body: dict[str, Any]) -> bytes:
    """The raw bytes of a streamed answer to ``body`` POSTed to ``url`` with the master
    key; asserts a 200."""
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=20) as http, http.stream(
            "POST", url, json=body, headers=MASTER_HEADERS,
        ) as response:
            assert response.status_code == 200
            return b"".join([part async for part in response.aiter_raw()])


async def leave_mid_stream(url: str, body: dict[str, Any], events: int) -> bytes:
    """POST ``body`` (a stream) with the master key, read until ``events`` SSE events
    arrived, then close the connection as a client that goes away; return what was read."""
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=20) as http, http.stream(
            "POST", url, json=body, headers=MASTER_HEADERS,
        ) as response:
            seen = b""
            async for part in response.aiter_raw():
                seen += part
                if seen.count(b"\n\n") == events:
                    break
            return seen


async def spend_rows(gateway: Gateway, count: int) -> list[SpendLogRow]:
    """The spend-log rows once the settler and the spend-log writer have drained, newest
    first; asserts there are ``count`` of them."""
    services = gateway.services
    assert services.spend_logs is not None and services.store is not None
    with trio.fail_after(10):
        await gateway.drained()
        await services.spend_logs.wait_drained()
    rows, total = await services.store.query_spend_logs()
    assert total == count
    return list(rows)


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    """A scripted upstream (``scripted_upstream.py``) on a random loopback port."""
    script = Scripted()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, script.handle, 0)
        script.port = listeners[0].socket.getsockname()[1]
        yield script
        nursery.cancel_scope.cancel()
