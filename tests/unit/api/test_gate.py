"""AdmissionGate alone: slots, arrival order, the wait bound (MockClock)."""

from __future__ import annotations

import trio
import trio.testing

from triogate.api.gate import AdmissionGate


async def test_no_limit_never_waits() -> None:
    gate = AdmissionGate(0, 0.0)
    assert all([await gate.enter() for _ in range(1000)])
    gate.leave()
    assert gate.waited == 0 and gate.refused == 0


async def test_waiters_get_slots_in_arrival_order(autojump_clock: trio.testing.MockClock) -> None:
    gate = AdmissionGate(1, 60.0)
    assert await gate.enter()
    order: list[int] = []

    async def wait(i: int) -> None:
        assert await gate.enter()
        order.append(i)
        await trio.sleep(1)
        gate.leave()

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(wait, i)
            await trio.testing.wait_all_tasks_blocked()
        gate.leave()
    assert order == [0, 1, 2, 3, 4]
    assert gate.waited == 5 and gate.peak == 1 and gate.admitting == 0


async def test_a_waiter_is_refused_exactly_at_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = AdmissionGate(1, 2.5)
    assert await gate.enter()
    start = trio.current_time()
    assert not await gate.enter()
    assert trio.current_time() - start == 2.5
    assert gate.refused == 1 and gate.admitting == 1
    gate.leave()
    assert await gate.enter()  # the refused waiter took nothing
    assert gate.admitting == 1
