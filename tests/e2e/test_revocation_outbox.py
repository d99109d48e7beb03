"""A revocation made while Redis is unreachable is announced once Redis is back.

Two gateways share one Redis and one SQL database. Redis becomes unreachable (a proxy in
front of it cuts every connection and refuses new ones), a key is revoked through gateway
A (saved in SQL; the announcement fails), then Redis is reachable again. B lost its
subscription meanwhile, so it reloads the key from Redis, where the row cached before
the revocation lives for 5 minutes: only the retried announcement (which deletes that
row and bumps the generation) makes B refuse the key within seconds.

(Pausing Redis with SIGSTOP does not lose the announcement: the kernel buffers the
pipeline the gateway wrote, and Redis executes it on SIGCONT, after the gateway gave up.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway
from tests.e2e.test_admin_api import admin_client, chat, poll, status_of
from tests.integration.conftest import TcpProxy
from triogate.redis_server import SyncServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


class UnixProxy(TcpProxy):
    """TCP on 127.0.0.1 → a unix socket (the test server's)."""

    def __init__(self, nursery: trio.Nursery, path: str) -> None:
        super().__init__(nursery, "", 0)
        self._path = path

    async def _open_upstream(self) -> trio.SocketStream:
        return await trio.open_unix_socket(self._path)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[SyncServer]:
    """A private server, started and stopped outside the Trio run (SyncServer waits for it
    synchronously, which must not happen on the loop)."""
    server = SyncServer(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def proxied_redis(private_redis: SyncServer) -> AsyncIterator[UnixProxy]:
    """The private server behind a proxy the test may take down."""
    async with trio.open_nursery() as nursery:
        proxy = UnixProxy(nursery, str(private_redis.spec.socket_path))
        await proxy.up()
        yield proxy
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("path", "body"), [
    ("/key/block", lambda key: {"key": key}),
    ("/key/delete", lambda key: {"keys": [key]}),
])
async def test_a_key_revoked_while_redis_is_unreachable_is_refused_everywhere_once_it_is_back(
    tmp_path: Path, proxied_redis: UnixProxy, upstream: FakeUpstream, path: str,
    body: Callable[[str], Any],
) -> None:
    url = f"redis://127.0.0.1:{proxied_redis.port}"
    shared = {"general_settings": {"database_url": f"sqlite:///{tmp_path / 'shared.db'}"},
              "triogate": {"redis": {"timeout_s": 0.3}}}
    config_a = gateway_config(tmp_path / "a", url, upstream.base_url, **shared)
    config_b = gateway_config(tmp_path / "b", url, upstream.base_url, **shared)
    with trio.fail_after(120):
        async with running_gateway(config_a) as a, running_gateway(config_b) as b, \
                admin_client(a) as api:
            key = (await api.post("/key/generate", {}))["key"]
            for gateway in (a, b):  # the identity is in memory and in Redis now
                assert (await chat(gateway, key)).choices
            assert a.services.identities is not None
            proxied_redis.down()
            revoked = await api.http.post(path, json=body(key))
            assert revoked.status_code == 200, revoked.text
            assert revoked.headers["x-triogate-degraded"] == "redis"
            assert a.services.identities.unannounced == 1
            await proxied_redis.up()

            async def refused_everywhere() -> bool:
                return all([await status_of(g, key) == 401 for g in (a, b)])

            # Far below the Redis row's 5 minutes and B's 60 s memory TTL.
            took_s = await poll(refused_everywhere, timeout_s=10, interval_s=0.05)
            assert a.services.identities.unannounced == 0
            print(f"refused everywhere {took_s:.2f} s after Redis was reachable again")
