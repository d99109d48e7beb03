"""The admission gate: a burst runs its pre-call checks a few requests at a time, waiting
in order for a bounded time, so the Redis round trips are not starved into failing open;
past the bound a request gets 503 with ``Retry-After`` in its API's shape and changes
nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.e2e.conftest import MASTER_HEADERS, gateway_config, running_gateway, short_request

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

HEADERS = MASTER_HEADERS
CHAT = short_request("chat", "gate")
MESSAGES = short_request("messages", "gate")


async def test_a_burst_is_admitted_at_most_max_admitting_at_a_time(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"max_admitting": 2, "max_admission_wait_s": 30})
    with trio.fail_after(60):
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            gate = gw.services.gate
            statuses: list[int] = []

            async def one(i: int) -> None:
                body = {**CHAT, "messages": [{"role": "user", "content": f"burst {i}"}]}
                r = await http.post(f"{gw.url}/v1/chat/completions", json=body,
                                    headers=HEADERS)
                statuses.append(r.status_code)

            async with trio.open_nursery() as nursery:
                for i in range(40):
                    nursery.start_soon(one, i)
    assert statuses == [200] * 40
    assert gate.peak == 2  # 40 requests in flight, never more than 2 admitting
    assert gate.admitting == 0 and gate.refused == 0
    assert len(upstream.requests) == 40


async def test_a_request_waits_for_a_free_slot_then_is_served(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"max_admitting": 1, "max_admission_wait_s": 30})
    with trio.fail_after(60):
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            gate = gw.services.gate
            assert await gate.enter()  # the only slot, held as a long admission would
            answers: list[httpx.Response] = []

            async def one() -> None:
                answers.append(await http.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                                               headers=HEADERS))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                while gate.waited == 0:
                    await trio.sleep(0.01)
                await trio.sleep(0.2)
                assert not answers and not upstream.requests  # still waiting its turn
                gate.leave()
    assert [r.status_code for r in answers] == [200]
    assert gate.refused == 0 and gate.admitting == 0


async def test_past_the_wait_bound_a_request_is_refused_and_changes_nothing(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"max_admitting": 1, "max_admission_wait_s": 0.2})
    with trio.fail_after(60):
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            gate = gw.services.gate
            assert await gate.enter()
            started = trio.current_time()
            chat = await http.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                                   headers=HEADERS)
            waited_s = trio.current_time() - started
            messages = await http.post(f"{gw.url}/v1/messages", json=MESSAGES,
                                       headers=HEADERS)
            gate.leave()
            after = await http.post(f"{gw.url}/v1/chat/completions", json=CHAT,
                                    headers=HEADERS)
    assert chat.status_code == 503 and messages.status_code == 503
    assert 0.2 <= waited_s < 5
    assert chat.headers["retry-after"] == "1" and messages.headers["retry-after"] == "1"
    error = chat.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "overloaded")
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "overloaded_error"
    assert "x-request-id" in chat.headers
    assert gate.refused == 2
    assert len(upstream.requests) == 1  # only the request after the slot came back
    assert after.status_code == 200
