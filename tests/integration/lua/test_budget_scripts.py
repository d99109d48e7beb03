"""budget_reserve.lua and budget_settle.lua, table-driven against a real server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from triogate.batch import CommandError
from triogate.governance.budgets import RESERVE, SETTLE
from triogate.governance.keys import budget_keys, budget_marker

from .support import hash_ints, load, one, run, zset

if TYPE_CHECKING:
    from triogate.batch import RespBackend

pytestmark = pytest.mark.integration

K = budget_keys("key", "k1", 7)
NOW = 1_700_000_000_000
MARKER = budget_marker("key", "k1", NOW)
LEASE = 600_000


@attrs.frozen
class ReserveRow:
    name: str
    estimate: int
    max_budget: int
    reply: list[int]
    spend: int = 0
    holds: dict[str, int] = attrs.Factory(dict)  # request id -> (amount)
    leases: dict[str, int] = attrs.Factory(dict)  # request id -> expiry
    after_holds: dict[str, int] | None = None
    after_reserved: int | None = None
    request_id: str = "r1"


def _state(row: ReserveRow) -> dict[str, object]:
    state: dict[str, object] = {}
    counters = {}
    if row.spend:
        counters["spend"] = row.spend
    if row.holds:
        counters["reserved"] = sum(row.holds.values())
        state[K.holds] = dict(row.holds)
        state[K.leases] = list(row.leases.items())
    if counters:
        state[K.counters] = counters
    return state


RESERVE_ROWS = [
    ReserveRow("fresh: reserve", 100, 1000, [1, 0, 100], after_holds={"r1": 100}),
    ReserveRow("exactly at the budget", 100, 1000, [1, 900, 100], spend=900,
               after_holds={"r1": 100}),
    ReserveRow("one nano-dollar over", 101, 1000, [0, 900, 0], spend=900, after_holds={}),
    ReserveRow("in-flight reservations count", 100, 1000, [0, 900, 50], spend=900,
               holds={"r0": 50}, leases={"r0": NOW + 1}, after_holds={"r0": 50}),
    ReserveRow("fresh period admits one large estimate", 5000, 1000, [1, 0, 5000],
               after_holds={"r1": 5000}),
    ReserveRow("...but not once something is reserved", 5000, 1000, [0, 0, 1],
               holds={"r0": 1}, leases={"r0": NOW + 1}, after_holds={"r0": 1}),
    ReserveRow("spent budget refuses", 1, 1000, [0, 1000, 0], spend=1000, after_holds={}),
    ReserveRow("spent budget, zero estimate", 0, 1000, [1, 1000, 0], spend=1000,
               after_holds={"r1": 0}),
    ReserveRow("zero budget refuses a fresh request", 1, 0, [0, 0, 0], after_holds={}),
    ReserveRow("expired lease is purged first", 200, 1000, [1, 400, 200], spend=400,
               holds={"r0": 500}, leases={"r0": NOW}, after_holds={"r1": 200},
               after_reserved=200),
    ReserveRow("lease expiring after now is kept", 200, 1000, [0, 400, 500], spend=400,
               holds={"r0": 500}, leases={"r0": NOW + 1}, after_holds={"r0": 500},
               after_reserved=500),
    ReserveRow("same request again changes nothing", 300, 1000, [1, 0, 300],
               holds={"r1": 300}, leases={"r1": NOW + 10}, after_holds={"r1": 300},
               after_reserved=300),
    ReserveRow("same request again, now over the budget, is still admitted", 300, 1000,
               [1, 900, 300], spend=900, holds={"r1": 300}, leases={"r1": NOW + 10},
               after_holds={"r1": 300}, after_reserved=300),
]


@pytest.mark.parametrize("row", RESERVE_ROWS, ids=lambda r: r.name)
async def test_budget_reserve(redis: RespBackend, row: ReserveRow) -> None:
    with trio.fail_after(5):
        await load(redis, _state(row))
        reply = await run(
            redis, RESERVE, K.as_tuple(),
            [NOW, row.request_id, row.estimate, row.max_budget, LEASE, 0],
        )
        assert reply == row.reply
        holds = await hash_ints(redis, K.holds)
        leases = await zset(redis, K.leases)
        counters = await hash_ints(redis, K.counters)
    assert holds == row.after_holds
    assert set(leases) == set(holds)
    if row.reply[0] and row.request_id not in row.holds:
        assert leases[row.request_id] == NOW + LEASE
    expected_reserved = (
        row.after_reserved if row.after_reserved is not None else sum(holds.values())
    )
    assert counters.get("reserved", 0) == expected_reserved
    assert counters.get("spend", 0) == row.spend


async def test_period_rollover_is_a_new_key(redis: RespBackend) -> None:
    spent, fresh = budget_keys("key", "k1", 7), budget_keys("key", "k1", 8)
    with trio.fail_after(5):
        await load(redis, {spent.counters: {"spend": 1000}})
        before = await run(redis, RESERVE, spent.as_tuple(), [NOW, "r1", 1, 1000, LEASE, 0])
        after = await run(redis, RESERVE, fresh.as_tuple(), [NOW, "r1", 1, 1000, LEASE, 0])
        old = await hash_ints(redis, spent.counters)
    assert before == [0, 1000, 0]
    assert after == [1, 0, 1]
    assert old == {"spend": 1000}


async def test_budget_reserve_sets_ttl_only_for_periodic_budgets(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await run(redis, RESERVE, K.as_tuple(), [NOW, "r1", 5, 100, LEASE, 90_000])
        ttls = [await one(redis, "PTTL", k) for k in K.as_tuple()]
        lifetime = budget_keys("key", "k1", 0)
        await run(redis, RESERVE, lifetime.as_tuple(), [NOW, "r1", 5, 100, LEASE, 0])
        forever = [await one(redis, "PTTL", k) for k in lifetime.as_tuple()]
    assert all(isinstance(t, int) and 80_000 < t <= 90_000 for t in ttls)
    assert forever == [-1, -1, -1]


async def test_budget_ttls_are_armed_when_the_keys_are_created(redis: RespBackend) -> None:
    """Reservations arm a key's TTL when they create it and leave it alone otherwise; the
    holds and leases, deleted whenever no request is in flight, are armed again each time
    they come back, so no key is ever left without a TTL."""
    settle_keys = (*K.as_tuple(), MARKER)

    async def ttls() -> list[object]:
        return [await one(redis, "PTTL", k) for k in K.as_tuple()]

    with trio.fail_after(5):
        await run(redis, RESERVE, K.as_tuple(), [NOW, "r1", 5, 10_000, LEASE, 90_000])
        created = await ttls()
        for key in K.as_tuple():
            await one(redis, "PEXPIRE", key, 5_000)
        await run(redis, RESERVE, K.as_tuple(), [NOW, "r2", 5, 10_000, LEASE, 90_000])
        kept = await ttls()
        for rid in ("r1", "r2"):
            await run(redis, SETTLE, settle_keys, [rid, 3, 90_000, 60_000])
        emptied = [await one(redis, "EXISTS", k) for k in K.as_tuple()]
        await run(redis, RESERVE, K.as_tuple(), [NOW, "r3", 5, 10_000, LEASE, 90_000])
        rearmed = await ttls()
        for i in range(30):
            await run(redis, RESERVE, K.as_tuple(), [NOW, f"q{i}", 5, 10_000, LEASE, 90_000])
            await run(redis, SETTLE, settle_keys, [f"q{i}", 2, 90_000, 60_000])
        after_many = await ttls()
        counters = await hash_ints(redis, K.counters)
    assert all(isinstance(t, int) and 80_000 < t <= 90_000 for t in created)
    assert all(isinstance(t, int) and 0 < t <= 5_000 for t in kept)
    assert emptied == [1, 0, 0]
    assert isinstance(rearmed[0], int) and 0 < rearmed[0] <= 5_000
    assert all(isinstance(t, int) and 80_000 < t <= 90_000 for t in rearmed[1:])
    assert all(isinstance(t, int) and 0 < t <= 90_000 for t in after_many)
    assert counters == {"spend": 3 * 2 + 2 * 30, "reserved": 5}


async def test_budget_settle_leaves_the_ttl_of_existing_counters(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await run(redis, RESERVE, K.as_tuple(), [NOW, "r1", 5, 100, LEASE, 90_000])
        await one(redis, "PEXPIRE", K.counters, 5_000)
        await run(redis, SETTLE, (*K.as_tuple(), MARKER), ["r1", 7, 90_000, 60_000])
        ttl = await one(redis, "PTTL", K.counters)
        counters = await hash_ints(redis, K.counters)
    assert isinstance(ttl, int) and 0 < ttl <= 5_000
    assert counters == {"spend": 7, "reserved": 0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([NOW, "r1", "abc", 100, LEASE, 0], "budget_reserve"),
        ([NOW, "r1", -1, 100, LEASE, 0], "budget_reserve"),
        ([NOW, "r1", "1.5", 100, LEASE, 0], "budget_reserve"),
        ([NOW, "r1", 1, 100, 0, 0], "budget_reserve"),
        ([NOW, "r1", 1, 100, LEASE], "budget_reserve"),
        ([NOW, "r1", 1, "inf", LEASE, 0], "budget_reserve"),
    ],
)
async def test_budget_reserve_refuses_bad_arguments(
    redis: RespBackend, args: list[object], message: str
) -> None:
    with trio.fail_after(5):
        reply = await run(redis, RESERVE, K.as_tuple(), args)
        assert await one(redis, "EXISTS", *K.as_tuple()) == 0
    assert isinstance(reply, CommandError)
    assert message in reply.reply


async def test_budget_scripts_refuse_wrong_types(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await load(redis, {K.counters: "not a hash"})
        reserve = await run(redis, RESERVE, K.as_tuple(), [NOW, "r1", 1, 100, LEASE, 0])
        settle = await run(redis, SETTLE, (*K.as_tuple(), MARKER), ["r1", 5, 0, 1000])
    assert isinstance(reserve, CommandError)
    assert "WRONGTYPE" in reserve.reply
    assert isinstance(settle, CommandError)
    assert "WRONGTYPE" in settle.reply


# --------------------------------------------------------------------------- settle


@attrs.frozen
class SettleRow:
    name: str
    actual: int
    reply: list[int]
    spend: int = 0
    holds: dict[str, int] = attrs.Factory(dict)
    after_spend: int = 0
    after_holds: dict[str, int] = attrs.Factory(dict)


SETTLE_ROWS = [
    SettleRow("release and charge", 80, [1, 100, 80], holds={"r1": 100}, after_spend=80),
    SettleRow("charge more than reserved", 150, [1, 100, 150], holds={"r1": 100},
              after_spend=150),
    SettleRow("release only (nothing charged)", 0, [1, 100, 0], spend=0, holds={"r1": 100}),
    SettleRow("reservation already purged: charge only", 50, [1, 0, 350], spend=300,
              after_spend=350),
    SettleRow("other reservations untouched", 10, [1, 20, 10], holds={"r1": 20, "r2": 30},
              after_spend=10, after_holds={"r2": 30}),
]


@pytest.mark.parametrize("row", SETTLE_ROWS, ids=lambda r: r.name)
async def test_budget_settle(redis: RespBackend, row: SettleRow) -> None:
    state: dict[str, object] = {}
    counters = {"spend": row.spend} if row.spend else {}
    if row.holds:
        counters["reserved"] = sum(row.holds.values())
        state[K.holds] = dict(row.holds)
        state[K.leases] = [(r, NOW + LEASE) for r in row.holds]
    if counters:
        state[K.counters] = counters
    with trio.fail_after(5):
        await load(redis, state)
        keys = (*K.as_tuple(), MARKER)
        first = await run(redis, SETTLE, keys, ["r1", row.actual, 0, 60_000])
        snapshot = (
            await hash_ints(redis, K.counters), await hash_ints(redis, K.holds),
            await zset(redis, K.leases),
        )
        # Replays (journal, retry) change nothing, however many.
        replays = [await run(redis, SETTLE, keys, ["r1", row.actual, 0, 60_000]) for _ in range(3)]
        again = (
            await hash_ints(redis, K.counters), await hash_ints(redis, K.holds),
            await zset(redis, K.leases),
        )
        marker_ttl = await one(redis, "PTTL", MARKER)
    assert first == row.reply
    assert replays == [[0, 0, row.after_spend]] * 3
    assert again == snapshot
    counters_after, holds_after, leases_after = snapshot
    assert counters_after.get("spend", 0) == row.after_spend
    assert counters_after.get("reserved", 0) == sum(row.after_holds.values())
    assert holds_after == row.after_holds
    assert set(leases_after) == set(row.after_holds)
    assert isinstance(marker_ttl, int) and 0 < marker_ttl <= 60_000


async def test_budget_settle_sets_ttl_when_charging(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await run(redis, SETTLE, (*K.as_tuple(), MARKER), ["r1", 5, 30_000, 60_000])
        ttl = await one(redis, "PTTL", K.counters)
        lifetime = budget_keys("key", "k1", 0)
        await run(redis, SETTLE, (*lifetime.as_tuple(), MARKER + "x"), ["r1", 5, 0, 60_000])
        forever = await one(redis, "PTTL", lifetime.counters)
    assert isinstance(ttl, int) and 20_000 < ttl <= 30_000
    assert forever == -1


async def test_replay_after_the_reservation_expired_charges_once(redis: RespBackend) -> None:
    keys = (*K.as_tuple(), MARKER)
    with trio.fail_after(5):
        assert await run(redis, RESERVE, K.as_tuple(), [NOW, "r1", 100, 1000, LEASE, 0]) == [
            1, 0, 100,
        ]
        # The process died; a lease later, another request purges the reservation.
        later = NOW + LEASE
        assert await run(redis, RESERVE, K.as_tuple(), [later, "r2", 100, 1000, LEASE, 0]) == [
            1, 0, 100,
        ]
        # The journal finally replays r1's settlement, twice.
        assert await run(redis, SETTLE, keys, ["r1", 70, 0, 60_000]) == [1, 0, 70]
        assert await run(redis, SETTLE, keys, ["r1", 70, 0, 60_000]) == [0, 0, 70]
        counters = await hash_ints(redis, K.counters)
        holds = await hash_ints(redis, K.holds)
    assert counters == {"spend": 70, "reserved": 100}
    assert holds == {"r2": 100}


async def test_zero_holds_are_released_and_purged(redis: RespBackend) -> None:
    """A hold of 0 (an estimate of 0) leaves `reserved` by 0 - 0, not -0: Redis 7.0 writes
    the number -0 as '-0', which HINCRBY refuses (found by the ledger property test)."""
    keys = (*K.as_tuple(), MARKER)
    with trio.fail_after(5):
        assert await run(redis, RESERVE, K.as_tuple(), [NOW, "r1", 0, 1000, LEASE, 0]) == [
            1, 0, 0,
        ]
        assert await run(redis, SETTLE, keys, ["r1", 5, 0, 60_000]) == [1, 0, 5]
        # A zero hold whose process died is purged by the next reservation.
        assert await run(redis, RESERVE, K.as_tuple(), [NOW, "r2", 0, 1000, LEASE, 0]) == [
            1, 5, 0,
        ]
        later = NOW + LEASE
        assert await run(redis, RESERVE, K.as_tuple(), [later, "r3", 7, 1000, LEASE, 0]) == [
            1, 5, 7,
        ]
        counters = await hash_ints(redis, K.counters)
    assert counters == {"spend": 5, "reserved": 7}


@pytest.mark.parametrize(
    "args",
    [["r1", -5, 0, 1000], ["r1", "x", 0, 1000], ["r1", 5, 0, 0], ["r1", 5, 0]],
)
async def test_budget_settle_refuses_bad_arguments(redis: RespBackend, args: list[object]) -> None:
    with trio.fail_after(5):
        reply = await run(redis, SETTLE, (*K.as_tuple(), MARKER), args)
        assert await one(redis, "EXISTS", MARKER) == 0
    assert isinstance(reply, CommandError)
    assert "budget_settle" in reply.reply


async def test_markers_hash_of_an_older_version_keeps_its_markers(redis: RespBackend) -> None:
    """A markers HASH an older version wrote (no PAD field, TTL armed by its first marker)
    still answers replays, gets the PAD field and a TTL that never lapses."""
    keys = (*K.as_tuple(), MARKER)
    with trio.fail_after(5):
        await one(redis, "HSET", MARKER, "old", "1")
        await one(redis, "PEXPIRE", MARKER, 30_000)
        assert (await run(redis, SETTLE, keys, ["old", 5, 0, 60_000]))[0] == 0  # type: ignore[index]
        assert await one(redis, "HLEN", MARKER) == 1  # a replay writes nothing
        assert (await run(redis, SETTLE, keys, ["new", 5, 0, 60_000]))[0] == 1  # type: ignore[index]
        fields = await one(redis, "HKEYS", MARKER)
        ttl = await one(redis, "PTTL", MARKER)
    assert isinstance(fields, list) and sorted(fields) == [b"new", b"old", b"~"]
    assert isinstance(ttl, int) and 30_000 < ttl <= 60_000


async def test_markers_of_many_requests_are_fields_of_one_hash(redis: RespBackend) -> None:
    keys = (*K.as_tuple(), MARKER)
    with trio.fail_after(5):
        for rid in ("a", "b", "c"):
            assert (await run(redis, SETTLE, keys, [rid, 5, 0, 60_000]))[0] == 1  # type: ignore[index]
        await one(redis, "PEXPIRE", MARKER, 50_000)  # a later marker must not extend it
        assert (await run(redis, SETTLE, keys, ["d", 5, 0, 60_000]))[0] == 1  # type: ignore[index]
        assert (await run(redis, SETTLE, keys, ["b", 5, 0, 60_000]))[0] == 0  # type: ignore[index]
        fields = await one(redis, "HKEYS", MARKER)
        ttl = await one(redis, "PTTL", MARKER)
        spend = await hash_ints(redis, K.counters)
        encoding = await one(redis, "OBJECT", "ENCODING", MARKER)
    # "~" is the PAD field: its long value keeps the hash a hashtable (O(1) HSETNX).
    assert isinstance(fields, list) and sorted(fields) == [b"a", b"b", b"c", b"d", b"~"]
    assert encoding == b"hashtable"
    assert isinstance(ttl, int) and 0 < ttl <= 50_000
    assert spend["spend"] == 20


W_R = "tg:{key:k1}:rl:rpm"
W_T = "tg:{key:k1}:rl:tpm"


@pytest.mark.parametrize(
    "args",
    [
        ["r1", 5, 0, 1000, "z", 1, 10, 5, 1000, "r", "t"],  # unknown mode
        ["r1", 5, 0, 1000, "a", 1, 10, 5, 1000, "r"],  # a kind missing
        ["r1", 5, 0, 1000, "a", 1, 10, 5, 1000, "r", "q"],  # unknown kind
        ["r1", 5, 0, 1000, "a", -1, 10, 5, 1000, "r", "t"],  # negative bucket
        ["r1", 5, 0, 1000, "a", 1, "x", 5, 1000, "r", "t"],  # not a number
        ["r1", 5, 0, 1000],  # windows without their arguments
    ],
)
async def test_budget_settle_with_windows_refuses_bad_arguments(
    redis: RespBackend, args: list[object]
) -> None:
    with trio.fail_after(5):
        reply = await run(redis, SETTLE, (*K.as_tuple(), MARKER, W_R, W_T), args)
        written = await one(redis, "EXISTS", MARKER, K.counters, W_R, W_T)
    assert isinstance(reply, CommandError) and "budget_settle" in reply.reply
    assert written == 0


async def test_budget_settle_with_windows_settles_both_once(redis: RespBackend) -> None:
    """One call: the hold released, the cost charged, the TPM bucket corrected to the actual
    tokens, the RPM count left; replays (twice) change nothing anywhere."""
    now = 1_700_000_000_500
    bucket = now // 1000
    with trio.fail_after(5):
        await load(redis, {K.counters: {"spend": 10, "reserved": 40}, K.holds: {"r1": 40},
                           K.leases: [("r1", now + 60_000)],
                           W_R: {str(bucket): 3, "t": 3, "o": bucket},
                           W_T: {str(bucket): 300, "t": 300, "o": bucket}})
        args = ["r1", 25, 0, 60_000, "a", bucket, 100, 70, now, "r", "t"]
        keys = (*K.as_tuple(), MARKER, W_R, W_T)
        replies = [await run(redis, SETTLE, keys, args) for _ in range(3)]
        counters = await hash_ints(redis, K.counters)
        holds = await hash_ints(redis, K.holds)
        rpm, tpm = await hash_ints(redis, W_R), await hash_ints(redis, W_T)
    assert replies == [[1, 40, 35], [0, 0, 35], [0, 0, 35]]
    assert counters == {"spend": 35, "reserved": 0} and holds == {}
    assert rpm == {str(bucket): 3, "t": 3, "o": bucket}
    assert tpm == {str(bucket): 270, "t": 270, "o": bucket}
