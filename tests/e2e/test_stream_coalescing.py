"""A worker that is behind forwards a stream's chunks a window at a time (``api/pacing.py``),
over real HTTP: the client gets the same bytes, the first event at once, later ones in
fewer, larger writes; the spend row is the one an unheld stream leaves; a client that
leaves while its stream is held is settled at once, as before.

"Behind" is made real: a task keeps the run loop busy with 20 ms steps of CPU work, so
the pacer's probe wakes late, as it does under thousands of streams.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.e2e.conftest import (
    MASTER_HEADERS,
    gateway_config,
    running_gateway,
    spend_rows,
)
from tests.e2e.test_raw_chat_stream import CONTENT, DONE, FINISH, USAGE

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from tests.e2e.scripted_upstream import Scripted
    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

WINDOW_S = 0.5
GAP_S = 0.04  # between the upstream's chunks: ten of them in well under a window
BODY = {"model": "gpt-test", "stream": True, "max_tokens": 50,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "a story"}]}
EVENTS = [*CONTENT, FINISH, USAGE, DONE]


@pytest.fixture
async def gateway(tmp_path: Path, redis: RespBackend, redis_url: str,
                  scripted: Scripted) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, f"http://127.0.0.1:{scripted.port}",
                            triogate={"stream_coalesce_window_s": WINDOW_S})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


async def _busy_loop(gateway: Gateway) -> None:
    """Keep the run loop busy: 20 ms of CPU work, then let one pass run; for ever. Counts
    as an open stream meanwhile: the pacer's probe runs only while one is."""
    gateway.services.pacer.opened()
    try:
        await _busy_steps()
    finally:
        gateway.services.pacer.closed()


async def _busy(nursery: trio.Nursery, gateway: Gateway) -> None:
    """Start the busy loop and return once the pacer has seen it (two late probe
    wake-ups): a stream started earlier would forward its first events unheld."""
    nursery.start_soon(_busy_loop, gateway)
    with trio.fail_after(5):
        while not gateway.services.pacer.behind:
            await trio.sleep(0.005)


async def _busy_steps() -> None:
    while True:
        end = time.monotonic() + 0.02
        while time.monotonic() < end:
            pass
        await trio.lowlevel.checkpoint()


async def _parts(gateway: Gateway) -> list[tuple[float, bytes]]:
    """The stream's bytes as the client's reads got them, with when."""
    parts = []
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=20) as http, http.stream(
            "POST", f"{gateway.openai_base}/chat/completions", json=BODY,
            headers=MASTER_HEADERS,
        ) as response:
            assert response.status_code == 200
            async for part in response.aiter_raw():
                parts.append((trio.current_time(), part))
    return parts


async def test_a_worker_behind_writes_a_window_of_chunks_at_once(
    gateway: Gateway, scripted: Scripted
) -> None:
    scripted.pieces = EVENTS
    scripted.gap_s = GAP_S
    pacer = gateway.services.pacer
    calm = await _parts(gateway)
    async with trio.open_nursery() as nursery:
        await _busy(nursery, gateway)
        holds = pacer.holds
        behind = await _parts(gateway)
        nursery.cancel_scope.cancel()
    assert b"".join(p for _, p in behind) == b"".join(p for _, p in calm) == b"".join(EVENTS)
    # The first event went out as it came, alone; the rest waited about a window (the
    # upstream sent them all within it) and left in one or two writes, not one each.
    assert behind[0][1] == CONTENT[0]
    assert behind[1][0] - behind[0][0] >= WINDOW_S - 0.01
    assert len(behind) <= 4 < len(EVENTS)
    assert pacer.holds > holds
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{gateway.url}/metrics")).text
    assert f"triogate_stream_holds {float(pacer.holds)}" in metrics
    # Settled alike: same status, tokens, cost, response id.
    new, old = await spend_rows(gateway, 2)
    assert (new.status, new.input_tokens, new.output_tokens, new.cost_nanousd,
            new.response_id) == (old.status, old.input_tokens, old.output_tokens,
                                 old.cost_nanousd, old.response_id)
    assert new.status == "success" and new.cost_nanousd > 0


async def test_a_client_that_leaves_while_its_stream_is_held_is_settled_at_once(
    gateway: Gateway, scripted: Scripted
) -> None:
    scripted.pieces = EVENTS[:-1]
    scripted.gap_s = GAP_S
    scripted.hang = True  # no end: the stream ends when the client leaves
    async with trio.open_nursery() as nursery:
        await _busy(nursery, gateway)
        # the second write comes after a hold; the client leaves during the next one
        seen = b""
        with trio.fail_after(20):
            async with httpx.AsyncClient(timeout=20) as http, http.stream(
                "POST", f"{gateway.openai_base}/chat/completions", json=BODY,
                headers=MASTER_HEADERS,
            ) as response:
                async for part in response.aiter_raw():
                    seen += part
                    if seen.count(b"\n\n") >= 2:
                        break
        left_at = trio.current_time()
        assert seen.startswith(CONTENT[0] + CONTENT[1])
        with trio.fail_after(WINDOW_S * 4):
            while scripted.gone < 1:  # the upstream stream was dropped
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert gateway.services.pacer.holds >= 1
    (row,) = await spend_rows(gateway, 1)
    assert row.status == "cancelled"
    assert row.output_tokens > 0 and row.cost_nanousd > 0
    assert trio.current_time() - left_at < WINDOW_S * 4
