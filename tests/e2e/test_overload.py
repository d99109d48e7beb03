"""Overload is refused, not queued: beyond ``triogate.max_in_flight`` requests in flight, a
request is answered 503 with ``Retry-After`` at once, in its API's error shape."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

LIMIT = 3
HEADERS = {"authorization": f"Bearer {MASTER_KEY}"}
CHAT: dict[str, Any] = {"model": "gpt-test", "max_tokens": 5,
                        "messages": [{"role": "user", "content": "hold on"}]}
MESSAGES: dict[str, Any] = {"model": "claude-test", "max_tokens": 5,
                            "messages": [{"role": "user", "content": "hold on"}]}


async def test_requests_beyond_the_limit_are_refused_at_once(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    upstream.latency_s = 2.0  # the admitted requests hold their places meanwhile
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"max_in_flight": LIMIT})
    held: list[httpx.Response] = []
    with trio.fail_after(60):
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:

            async def hold() -> None:
                held.append(await http.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                                            headers=HEADERS))

            async with trio.open_nursery() as nursery:
                for _ in range(LIMIT):
                    nursery.start_soon(hold)
                while len(upstream.requests) < LIMIT:  # all three reached the upstream
                    await trio.sleep(0.01)
                refused = [await http.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                                           headers=HEADERS) for _ in range(4)]
                refused.append(await http.post(f"{gw.url}/v1/messages", json=MESSAGES,
                                               headers=HEADERS))
                probe = await http.get(f"{gw.url}/health/liveliness")
                upstream_calls_while_full = len(upstream.requests)
            after = await http.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                                    headers=HEADERS)
    assert [r.status_code for r in held] == [200] * LIMIT
    assert [r.status_code for r in refused] == [503] * 5
    assert all(r.headers["retry-after"] == "1" for r in refused)
    assert refused[0].json()["error"]["code"] == "overloaded"
    assert refused[0].json()["error"]["type"] == "service_unavailable"
    assert refused[-1].json() == {"type": "error", "error": {
        "type": "overloaded_error", "message": refused[-1].json()["error"]["message"]}}
    assert upstream_calls_while_full == LIMIT  # the refused ones never went upstream
    assert probe.status_code == 200
    assert after.status_code == 200  # places are given back
