"""LeaseKeeper: one task renews every request in flight; a request costs a dict entry."""

from __future__ import annotations

import trio

from triogate.governance.facts import CheckSettings
from triogate.governance.leases import Held, LeaseKeeper


def _keeper() -> LeaseKeeper:
    return LeaseKeeper({}, CheckSettings(lease_ms=30_000), lambda: 0)


async def test_only_requests_older_than_half_an_interval_are_asked_for_their_leases(
    autojump_clock: trio.abc.Clock,
) -> None:
    keeper = _keeper()
    assert keeper.interval_s == 10
    asked: list[str] = []

    def leases(name: str) -> Held:
        asked.append(name)
        return {}  # nothing held: no round trip

    with keeper.kept("old", lambda: leases("old")):
        await trio.sleep(6)
        with keeper.kept("young", lambda: leases("young")):
            assert keeper.in_flight() == 2
            assert await keeper.renew_due() == 0
            assert asked == ["old"]
            await trio.sleep(5)
            await keeper.renew_due()
            assert asked == ["old", "old", "young"]
        assert keeper.in_flight() == 1
    assert keeper.in_flight() == 0
    assert keeper.rounds == 0  # nothing was held, so nothing was sent


async def test_an_exception_in_the_block_unregisters_and_travels_unwrapped() -> None:
    keeper = _keeper()
    try:
        with keeper.kept("r", dict):
            raise KeyError("boom")
    except KeyError as exc:
        assert exc.args == ("boom",)
    assert keeper.in_flight() == 0
