"""rate_admit.lua and rate_settle.lua, table-driven against a real server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from triogate.batch import CommandError
from triogate.governance.keys import PARALLEL, RPM, TPM, rate_marker, rate_window_key
from triogate.governance.rate_limits import ADMIT, SETTLE

from .support import load, one, run, window_buckets, zset

if TYPE_CHECKING:
    from triogate.batch import RespBackend

pytestmark = pytest.mark.integration

R = rate_window_key("key", "k1", RPM)
T = rate_window_key("key", "k1", TPM)
P = rate_window_key("key", "k1", PARALLEL)
MR = rate_window_key("key", "k1", RPM, "gpt-4o")
NOW = 1_700_000_000_500  # half-way through bucket CUR
MARKER = rate_marker("key", "k1", NOW)
CUR = NOW // 1000
LEASE = 600_000


@attrs.frozen
class AdmitRow:
    name: str
    windows: list[tuple[str, str, int]]  # (key, kind, limit)
    reply: list[int]
    state: dict[str, object] = attrs.Factory(dict)
    after: dict[str, object] | None = None  # None: state unchanged
    estimate: int = 10


ADMIT_ROWS = [
    AdmitRow("fresh rpm", [(R, "r", 2)], [1, 0, 0, 1], after={R: {str(CUR): 1}}),
    AdmitRow("rpm full: retry when the oldest bucket leaves", [(R, "r", 2)],
             [0, 1, (CUR - 10 + 60) * 1000 - NOW, 0],
             state={R: {str(CUR - 10): 1, str(CUR - 5): 1}}),
    AdmitRow("rpm over by one: only the oldest bucket must leave", [(R, "r", 3)],
             [0, 1, (CUR - 10 + 60) * 1000 - NOW, 0],
             state={R: {str(CUR - 10): 2, str(CUR - 5): 2}}),
    AdmitRow("rpm full: retry waits for enough buckets", [(R, "r", 2)],
             [0, 1, (CUR - 5 + 60) * 1000 - NOW, 0],
             state={R: {str(CUR - 10): 2, str(CUR - 5): 2}}),
    AdmitRow("bucket 60 s old has left the window and is deleted", [(R, "r", 2)],
             [1, 0, 0, 0], state={R: {str(CUR - 60): 5, str(CUR - 1): 1}},
             after={R: {str(CUR - 1): 1, str(CUR): 1}}),
    AdmitRow("bucket 59 s old still counts", [(R, "r", 2)],
             [0, 1, 1000 - 500, 0], state={R: {str(CUR - 59): 2}}),
    AdmitRow("a bucket from a clock running ahead counts", [(R, "r", 2)],
             [0, 1, (CUR + 2 + 60) * 1000 - NOW, 0], state={R: {str(CUR + 2): 2}}),
    AdmitRow("tpm reserves the estimate", [(T, "t", 100)], [1, 0, 0, 30],
             state={T: {str(CUR - 3): 60}}, after={T: {str(CUR - 3): 60, str(CUR): 10}}),
    AdmitRow("tpm over: retry frees only what is needed", [(T, "t", 100)],
             [0, 1, (CUR - 20 + 60) * 1000 - NOW, 10], estimate=20,
             state={T: {str(CUR - 30): 5, str(CUR - 20): 10, str(CUR - 3): 75}}),
    AdmitRow("tpm: an idle window admits one big request", [(T, "t", 100)], [1, 0, 0, 0],
             estimate=500, after={T: {str(CUR): 500}}),
    AdmitRow("tpm: a big request waits for the whole window to empty", [(T, "t", 100)],
             [0, 1, (CUR - 2 + 60) * 1000 - NOW, 99], estimate=500,
             state={T: {str(CUR - 10): 0, str(CUR - 2): 1}}),
    AdmitRow("tpm zero estimate adds nothing", [(T, "t", 100)], [1, 0, 0, 100], estimate=0),
    AdmitRow("parallel slot taken", [(P, "p", 2)], [1, 0, 0, 0],
             state={P: [("r0", NOW + 1)]}, after={P: {"r0": NOW + 1, "r1": NOW + LEASE}}),
    AdmitRow("parallel full: retry in 1 s", [(P, "p", 2)], [0, 1, 1000, 0],
             state={P: [("r0", NOW + 1), ("r2", NOW + 5)]}),
    AdmitRow("expired slots are not live and are purged", [(P, "p", 2)], [1, 0, 0, 0],
             state={P: [("r0", NOW), ("r2", NOW - 5), ("r3", NOW + 9)]},
             after={P: {"r3": NOW + 9, "r1": NOW + LEASE}}),
    AdmitRow("all or nothing: tpm fails, rpm is not counted",
             [(R, "r", 5), (T, "t", 100)], [0, 2, (CUR - 1 + 60) * 1000 - NOW, 4, 5],
             estimate=20, state={R: {str(CUR - 1): 1}, T: {str(CUR - 1): 95}}),
    AdmitRow("first failing window reported, longest retry returned",
             [(R, "r", 1), (P, "p", 1), (MR, "r", 1)],
             [0, 1, (CUR - 1 + 60) * 1000 - NOW, 0, 0, 0],
             state={R: {str(CUR - 30): 1}, P: [("r0", NOW + 5)], MR: {str(CUR - 1): 1}}),
    AdmitRow("all windows counted together",
             [(R, "r", 5), (T, "t", 100), (P, "p", 3), (MR, "r", 2)],
             [1, 0, 0, 4, 90, 2, 1],
             after={R: {str(CUR): 1}, T: {str(CUR): 10}, P: {"r1": NOW + LEASE},
                    MR: {str(CUR): 1}}),
    AdmitRow("zero limit refuses", [(R, "r", 0)], [0, 1, 60_000, 0]),
]


async def _snapshot(redis: RespBackend, keys: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in keys:
        kind = await one(redis, "TYPE", key)
        if kind == b"hash":
            out[key] = await window_buckets(redis, key)
        elif kind == b"zset":
            out[key] = await zset(redis, key)
    return out


def _expected(state: dict[str, object]) -> dict[str, object]:
    """Initial-state notation (ZSETs as pair lists) in snapshot form (dicts of ints)."""
    out: dict[str, object] = {}
    for key, value in state.items():
        assert isinstance(value, (list, dict))
        out[key] = dict(value) if isinstance(value, list) else {f: int(c) for f, c in value.items()}
    return out


def _args(windows: list[tuple[str, str, int]], estimate: int, now: int = NOW) -> list[object]:
    args: list[object] = [now, "r1", estimate, LEASE]
    for _, kind, limit in windows:
        args += [kind, limit]
    return args


@pytest.mark.parametrize("row", ADMIT_ROWS, ids=lambda r: r.name)
async def test_rate_admit(redis: RespBackend, row: AdmitRow) -> None:
    keys = [k for k, _, _ in row.windows]
    with trio.fail_after(5):
        await load(redis, row.state)
        reply = await run(redis, ADMIT, keys, _args(row.windows, row.estimate))
        after = await _snapshot(redis, keys)
    assert reply == row.reply
    assert after == _expected(row.after if row.after is not None else row.state)


async def test_rate_admit_sets_ttls(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await run(redis, ADMIT, [R, T, P], _args([(R, "r", 5), (T, "t", 50), (P, "p", 2)], 5))
        ttls = [await one(redis, "PTTL", k) for k in (R, T, P)]
    assert all(isinstance(t, int) for t in ttls)
    assert 60_000 < ttls[0] <= 120_000 and 60_000 < ttls[1] <= 120_000  # type: ignore[operator]
    assert LEASE < ttls[2] <= LEASE + 120_000  # type: ignore[operator]


async def test_rate_admit_arms_the_ttl_when_a_bucket_is_created(redis: RespBackend) -> None:
    """The TTL is armed by the write that creates a bucket and left alone by writes to a
    bucket that exists; many admissions never leave a window without one."""
    windows = [(R, "r", 1000), (T, "t", 100_000)]
    with trio.fail_after(5):
        for i in range(50):
            args = _args(windows, 5)
            args[1] = f"q{i}"
            await run(redis, ADMIT, [R, T], args)
        many = [await one(redis, "PTTL", k) for k in (R, T)]
        for k in (R, T):
            await one(redis, "PEXPIRE", k, 5_000)
        await run(redis, ADMIT, [R, T], _args(windows, 5))  # same bucket: TTL left alone
        same = [await one(redis, "PTTL", k) for k in (R, T)]
        await run(redis, ADMIT, [R, T], _args(windows, 5, NOW + 1000))  # a new bucket
        fresh = [await one(redis, "PTTL", k) for k in (R, T)]
        counts = [await window_buckets(redis, k) for k in (R, T)]
    assert all(isinstance(t, int) and 110_000 < t <= 120_000 for t in many)
    assert all(isinstance(t, int) and 0 < t <= 5_000 for t in same)
    assert all(isinstance(t, int) and 110_000 < t <= 120_000 for t in fresh)
    assert counts == [{str(CUR): 51, str(CUR + 1): 1}, {str(CUR): 255, str(CUR + 1): 5}]


async def test_windows_are_hashtables_and_older_listpack_windows_still_count(
    redis: RespBackend,
) -> None:
    """A window's new bucket brings the PAD field (a value longer than
    hash-max-listpack-value), so HMGET/HSET look fields up in O(1); a window an older
    version wrote (a listpack, no PAD) is read the same and converted by its next bucket."""
    with trio.fail_after(5):
        await load(redis, {R: {str(CUR - 3): 2, "t": 2, "o": CUR - 3}})
        assert await one(redis, "OBJECT", "ENCODING", R) == b"listpack"
        reply = await run(redis, ADMIT, [R], _args([(R, "r", 10)], 5))
        encoding = await one(redis, "OBJECT", "ENCODING", R)
        buckets = await window_buckets(redis, R)
        rejected = await run(redis, ADMIT, [R], _args([(R, "r", 3)], 5))
        after_rejection = await window_buckets(redis, R)
    assert reply == [1, 0, 0, 7]
    assert encoding == b"hashtable"
    assert buckets == {str(CUR - 3): 2, str(CUR): 1}
    assert isinstance(rejected, list) and rejected[:2] == [0, 1]
    assert after_rejection == buckets  # a rejection writes nothing


async def test_rate_settle_arms_the_ttl_only_when_it_creates_a_bucket(
    redis: RespBackend,
) -> None:
    args = ["r1", "a", CUR, 10, 30, NOW, 60_000, "t"]
    with trio.fail_after(5):
        await load(redis, {T: {str(CUR): 10, "t": 10, "o": CUR}})
        await one(redis, "PEXPIRE", T, 5_000)
        await run(redis, SETTLE, [T, MARKER], args)  # the bucket exists: TTL left alone
        kept = await one(redis, "PTTL", T)
        await one(redis, "DEL", T)
        await load(redis, {T: {str(CUR - 1): 10, "t": 10, "o": CUR - 1}})
        await run(redis, SETTLE, [T, MARKER], ["r2", *args[1:]])  # creates bucket CUR
        armed = await one(redis, "PTTL", T)
        after = await window_buckets(redis, T)
    assert isinstance(kept, int) and 0 < kept <= 5_000
    assert isinstance(armed, int) and 110_000 < armed <= 120_000
    assert after == {str(CUR - 1): 10, str(CUR): 20}


@pytest.mark.parametrize(
    "args",
    [
        [NOW, "r1", 10, LEASE, "z", 5],
        [NOW, "r1", 10, LEASE, "r", -1],
        [NOW, "r1", 10, LEASE, "r"],
        [NOW, "r1", "ten", LEASE, "r", 5],
        [NOW, "r1", 10, 0, "r", 5],
        ["soon", "r1", 10, LEASE, "r", 5],
    ],
)
async def test_rate_admit_refuses_bad_arguments(redis: RespBackend, args: list[object]) -> None:
    with trio.fail_after(5):
        reply = await run(redis, ADMIT, [R], args)
        assert await one(redis, "EXISTS", R) == 0
    assert isinstance(reply, CommandError)
    assert "rate_admit" in reply.reply


async def test_rate_scripts_refuse_wrong_types(redis: RespBackend) -> None:
    with trio.fail_after(5):
        await load(redis, {R: "a string", P: {"f": 1}})
        admit = await run(redis, ADMIT, [R], _args([(R, "r", 5)], 1))
        parallel = await run(redis, ADMIT, [P], _args([(P, "p", 5)], 1))
        settle = await run(redis, SETTLE, [R, MARKER], ["r1", "u", CUR, 1, 1, NOW, 1000, "r"])
    for reply in (admit, parallel, settle):
        assert isinstance(reply, CommandError)
        assert "WRONGTYPE" in reply.reply


# --------------------------------------------------------------------------- settle


@attrs.frozen
class SettleRow:
    name: str
    mode: str
    actual: int
    state: dict[str, object]
    after: dict[str, object]
    bucket: int = CUR - 2
    estimate: int = 40


W3 = [(R, "r"), (T, "t"), (P, "p")]
COUNTED: dict[str, object] = {
    R: {str(CUR - 2): 3}, T: {str(CUR - 2): 100}, P: [("r1", NOW + LEASE), ("r9", NOW + 9)],
}

SETTLE_ROWS = [
    SettleRow("admitted: tpm corrected to actual, slot released", "a", 25, COUNTED,
              {R: {str(CUR - 2): 3}, T: {str(CUR - 2): 85}, P: {"r9": NOW + 9}}),
    SettleRow("admitted: actual above estimate", "a", 70, COUNTED,
              {R: {str(CUR - 2): 3}, T: {str(CUR - 2): 130}, P: {"r9": NOW + 9}}),
    SettleRow("cache hit: whole reservation back", "a", 0,
              {T: {str(CUR - 2): 40}, P: [("r1", NOW + LEASE)]}, {}),
    SettleRow("undo: no trace left", "u", 0, COUNTED,
              {R: {str(CUR - 2): 2}, T: {str(CUR - 2): 60}, P: {"r9": NOW + 9}}),
    SettleRow("undo of the only request deletes its buckets", "u", 0,
              {R: {str(CUR - 2): 1}, T: {str(CUR - 2): 40}, P: [("r1", NOW + LEASE)]}, {}),
    SettleRow("release only: counts stay", "x", 0, COUNTED,
              {R: {str(CUR - 2): 3}, T: {str(CUR - 2): 100}, P: {"r9": NOW + 9}}),
    SettleRow("bucket slid out: counts untouched, slot released", "u", 0,
              {R: {str(CUR - 60): 1, str(CUR): 4}, P: [("r1", NOW + LEASE)]},
              {R: {str(CUR - 60): 1, str(CUR): 4}}, bucket=CUR - 60),
    SettleRow("bucket slid out is not re-created", "a", 90, {R: {str(CUR): 4}},
              {R: {str(CUR): 4}}, bucket=CUR - 61),
]


@pytest.mark.parametrize("row", SETTLE_ROWS, ids=lambda r: r.name)
async def test_rate_settle(redis: RespBackend, row: SettleRow) -> None:
    keys = [k for k, _ in W3]
    args = ["r1", row.mode, row.bucket, row.estimate, row.actual, NOW, 60_000,
            *(kind for _, kind in W3)]
    with trio.fail_after(5):
        await load(redis, row.state)
        first = await run(redis, SETTLE, [*keys, MARKER], args)
        after = await _snapshot(redis, keys)
        replays = [await run(redis, SETTLE, [*keys, MARKER], args) for _ in range(3)]
        again = await _snapshot(redis, keys)
        marker_ttl = await one(redis, "PTTL", MARKER)
    assert first == 1
    assert after == _expected(row.after)
    assert replays == [0, 0, 0]
    assert again == after
    assert isinstance(marker_ttl, int) and 0 < marker_ttl <= 60_000


@pytest.mark.parametrize(
    "args",
    [
        ["r1", "q", CUR, 1, 1, NOW, 1000, "r"],
        ["r1", "a", CUR, -1, 1, NOW, 1000, "r"],
        ["r1", "a", CUR, 1, 1, NOW, 0, "r"],
        ["r1", "a", CUR, 1, 1, NOW, 1000],
        ["r1", "a", CUR, 1, 1, NOW, 1000, "y"],
    ],
)
async def test_rate_settle_refuses_bad_arguments(redis: RespBackend, args: list[object]) -> None:
    with trio.fail_after(5):
        reply = await run(redis, SETTLE, [R, MARKER], args)
        assert await one(redis, "EXISTS", MARKER) == 0
    assert isinstance(reply, CommandError)
    assert "rate_settle" in reply.reply
