"""A complete answer's settlement waits for an idle worker (``api/settle_later.py``), over
real HTTP: not between the answer and the client's next request, and still exactly once,
whole for whoever reads the accounting (admin routes, /metrics, the settler's drain,
shutdown), and at once for a request that gives back a parallel slot.

The tests hold settlements back for a minute (the queue's cushion and delay), so that
whether a drain happened is never a matter of timing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from triogate.store import open_store

from .conftest import (
    MASTER_HEADERS,
    gateway_config,
    running_gateway,
    short_request,
    spend_rows,
)

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.testing.fakeupstream import FakeUpstream

    from .conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def _hold(gateway: Gateway) -> None:
    """Settlements wait until something drains them."""
    gateway.services.later.cushion_s = 60.0
    gateway.services.later.max_delay_s = 60.0


def _requests_total(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("triogate_requests_total{"))


async def test_an_answer_settles_later_and_a_scrape_sees_it_whole(gateway: Gateway) -> None:
    _hold(gateway)
    later = gateway.services.later
    async with httpx.AsyncClient(base_url=gateway.url, timeout=20) as http:
        with trio.fail_after(20):
            answer = await http.post("/v1/chat/completions", headers=MASTER_HEADERS,
                                     json=short_request("chat", "settle me later"))
        assert answer.status_code == 200, answer.text
        assert later.deferred == 1
        assert later.drains == 0  # the client has its answer; the accounting waits
        with trio.fail_after(20):
            metrics = await http.get("/metrics")
    assert later.drains == 1  # a route that calls no model drains first
    assert _requests_total(metrics.text) == 1
    (row,) = await spend_rows(gateway, 1)
    assert row.status == "success" and row.cost_nanousd > 0
    # The row's end is the request's, not the drain's: well under the minute held.
    assert row.end_time_ms - row.start_time_ms < 20_000


async def test_the_settlers_drain_takes_what_waits(gateway: Gateway) -> None:
    _hold(gateway)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=20) as http:
        with trio.fail_after(20):
            for i in range(3):
                answer = await http.post("/v1/chat/completions", headers=MASTER_HEADERS,
                                         json=short_request("chat", f"drain me {i}"))
                assert answer.status_code == 200, answer.text
    assert gateway.services.later.deferred == 3
    rows = await spend_rows(gateway, 3)  # settler.wait_drained() runs the drain hook
    assert {r.status for r in rows} == {"success"}
    assert len({r.request_id for r in rows}) == 3


async def test_a_request_with_a_parallel_slot_settles_at_once(gateway: Gateway) -> None:
    """The client's next request needs the slot back as soon as it has its answer."""
    _hold(gateway)
    assert gateway.services.store is not None
    key, _ = await gateway.services.store.create_key(max_parallel_requests=1)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=20) as http:
        with trio.fail_after(20):
            for i in range(4):
                answer = await http.post(
                    "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                    json=short_request("chat", f"one at a time {i}"))
                assert answer.status_code == 200, answer.text
    assert gateway.services.later.deferred == 0
    await spend_rows(gateway, 4)


async def test_shutdown_settles_what_waits(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream, redis: object,
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url)
    with trio.fail_after(60):
        async with running_gateway(config) as gw, httpx.AsyncClient(
                base_url=gw.url, timeout=20) as http:
            _hold(gw)
            for i in range(3):
                answer = await http.post("/v1/chat/completions", headers=MASTER_HEADERS,
                                         json=short_request("chat", f"before shutdown {i}"))
                assert answer.status_code == 200, answer.text
            assert gw.services.later.deferred == 3
            assert gw.services.later.drains == 0
    async with open_store(None, state_dir=tmp_path / "state") as store:
        rows, total = await store.query_spend_logs()
    assert total == 3 and {r.status for r in rows} == {"success"}
    assert not list((tmp_path / "state" / "journal").glob("*.jsonl"))
