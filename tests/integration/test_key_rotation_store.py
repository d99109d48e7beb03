"""The store's key rotation on SQLite and PostgreSQL: the id stays, the secret changes,
a previous secret works until its grace period ends, and of two rotations racing for
one due key exactly one wins."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from triogate.store import hash_key

if TYPE_CHECKING:
    from triogate.store import Store

    from .conftest import FakeWallClock


async def test_rotation_keeps_the_id_and_honours_the_grace_period(
        store: Store, wall_clock: FakeWallClock) -> None:
    raw, row = await store.create_key(key_alias="ci", max_budget_nanousd=5)
    rotated = await store.rotate_key(row.token_hash, grace_ms=60_000)
    assert rotated is not None
    new_raw, new_row, old_secret = rotated
    assert old_secret == hash_key(raw) == new_row.token_hash == row.token_hash
    assert new_row.secret_hash == hash_key(new_raw) and new_row.rotation_count == 1
    assert new_row.max_budget_nanousd == 5 and new_row.key_hint == f"sk-...{new_raw[-4:]}"
    found = await store.keys_by_secret([hash_key(raw), hash_key(new_raw)])
    assert found[hash_key(new_raw)] == (new_row, None)
    assert found[hash_key(raw)][1] == wall_clock.now_ms + 60_000
    wall_clock.now_ms += 60_001
    assert hash_key(raw) not in await store.keys_by_secret([hash_key(raw)])
    # A second rotation without grace: the first new secret stops at once.
    again = await store.rotate_key(row.token_hash)
    assert again is not None
    assert await store.keys_by_secret([hash_key(new_raw)]) == {}
    assert again[1].rotation_count == 2 and again[2] == hash_key(new_raw)


async def test_of_two_rotations_of_a_due_key_one_wins(
        store: Store, wall_clock: FakeWallClock) -> None:
    _, row = await store.create_key(auto_rotate=True, rotation_interval="1h",
                                    key_rotation_at_ms=wall_clock.now_ms - 1)
    (due,) = await store.keys_due_for_rotation()
    results: list[object] = []

    async def rotate() -> None:
        results.append(await store.rotate_key(
            row.token_hash, next_rotation_at_ms=wall_clock.now_ms + 3_600_000,
            due_at_ms=due.key_rotation_at_ms))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rotate)
            nursery.start_soon(rotate)
    assert sorted(r is None for r in results) == [False, True]
    assert await store.keys_due_for_rotation() == []
    (current,) = (await store.get_keys([row.token_hash])).values()
    assert current.rotation_count == 1
