"""Helpers for script tests: run a script by EVAL, read state back."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from triogate.batch import RespBackend, Script


async def run(
    redis: RespBackend, script: Script, keys: Sequence[str], args: Sequence[object]
) -> object:
    """EVAL ``script`` once; returns the reply or the CommandError instance."""
    wire = ("EVAL", script.source, len(keys), *keys, *args)
    (reply,) = await redis.execute([wire])  # type: ignore[list-item]
    return reply


async def one(redis: RespBackend, *command: object) -> object:
    (reply,) = await redis.execute([command])  # type: ignore[list-item]
    return reply


#: The field the scripts write to keep a HASH out of the listpack encoding (its value is
#: longer than hash-max-listpack-value): not a counter, bucket or marker.
PAD_FIELD, PAD = "~", b"-" * 72


async def hash_ints(redis: RespBackend, key: str) -> dict[str, int]:
    """A HASH of integers as ``{field: value}``, without the PAD field (checked)."""
    flat = await one(redis, "HGETALL", key)
    assert isinstance(flat, list)
    out = {flat[i].decode(): flat[i + 1] for i in range(0, len(flat), 2)}
    if PAD_FIELD in out:
        assert out.pop(PAD_FIELD) == PAD, (key, out)
    return {field: int(value) for field, value in out.items()}


async def window_buckets(redis: RespBackend, key: str) -> dict[str, int]:
    """A rate window's buckets ``{epoch second: count}``, after checking its summary: the
    field ``t`` equals the sum of every bucket, and no bucket is below the field ``o``
    (rate_admit.lua keeps both; a window written by the tests' own state has neither)."""
    fields = await hash_ints(redis, key)
    total, low = fields.pop("t", None), fields.pop("o", None)
    if total is not None:
        assert total == sum(fields.values()), (key, total, fields)
    if low is not None:
        assert all(int(b) >= low for b in fields), (key, low, fields)
    return fields


async def zset(redis: RespBackend, key: str) -> dict[str, int]:
    """A ZSET as ``{member: score}``."""
    flat = await one(redis, "ZRANGE", key, 0, -1, "WITHSCORES")
    assert isinstance(flat, list)
    return {flat[i].decode(): int(float(flat[i + 1])) for i in range(0, len(flat), 2)}


async def load(redis: RespBackend, state: dict[str, object]) -> None:
    """Write initial state: a dict value is a HASH, a list of (member, score) a ZSET,
    anything else a STRING."""
    commands: list[tuple[object, ...]] = []
    for key, value in state.items():
        if isinstance(value, dict):
            for field, v in value.items():
                commands.append(("HSET", key, field, v))
        elif isinstance(value, list):
            for member, score in value:
                commands.append(("ZADD", key, score, member))
        else:
            commands.append(("SET", key, value))
    if commands:
        await redis.execute(commands)  # type: ignore[arg-type]
