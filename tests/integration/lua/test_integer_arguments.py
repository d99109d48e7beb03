"""The scripts pass integers to redis.call as Lua numbers on some servers: check it is exact.

Why: a Lua number given to redis.call is turned into the command's argument by the
server, not by Lua. Valkey 8.1+ prints an integer-valued number with its integer
printer (exact, and ~1,500 instructions cheaper than string.format); Redis 7.0 prints
'%.17g' (exact below 2^53, but dearer than string.format), and Redis 7.2.0-7.2.4 printed
100000000 as 1e+08, which HINCRBY refuses. So the scripts use numbers only where
``NUM`` (the same expression in every script) is true, and this test checks, on the
server the suite runs against, that where ``NUM`` holds every integer the scripts may
write (money up to 2^53 nano-USD, negative deltas for HINCRBY, epoch ms, bucket indices)
is written digit for digit as ``'%d'`` would write it.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from triogate.batch import Script

from .support import run

if TYPE_CHECKING:
    from triogate.batch import RespBackend

pytestmark = pytest.mark.integration

#: The condition every script uses (keep it identical to theirs).
NUM = "(redis.VALKEY_VERSION_NUM or 0) >= 0x080100"

#: Writes each argument's number with HSET and HINCRBY (as a number), reads both back and
#: returns the mismatches; {-1} when NUM is false (the scripts then format with '%d').
PROBE = Script.from_source(
    "integer_probe",
    f"""
if not ({NUM}) then return {{-1}} end
local bad = {{}}
for i = 1, #ARGV do
  local v = ARGV[i] + 0
  redis.call('HSET', KEYS[1], 'f', v)
  local s = redis.call('HGET', KEYS[1], 'f')
  if s ~= ARGV[i] then bad[#bad + 1] = ARGV[i] .. ' -> ' .. s end
  redis.call('DEL', KEYS[2])
  redis.call('HINCRBY', KEYS[2], 'f', v)
  s = redis.call('HGET', KEYS[2], 'f')
  if s ~= ARGV[i] then bad[#bad + 1] = 'HINCRBY ' .. ARGV[i] .. ' -> ' .. s end
end
return bad
"""
)


def _values() -> list[int]:
    """Powers of two and of ten and their neighbours (where printers switch notation),
    multiples of 10^8 (Redis 7.2.0-7.2.4's 1e+08), and random values up to 2^53."""
    values: set[int] = set()
    for e in range(54):
        values |= {2**e - 1, 2**e, 2**e + 1}
    for e in range(17):
        for m in (1, 2, 5, 9, 12, 123, 999):
            values |= {m * 10**e - 1, m * 10**e, m * 10**e + 1}
    rng = random.Random(13)
    values |= {rng.randrange(2**53) for _ in range(2000)}
    values |= {rng.randrange(10 ** rng.randrange(1, 16)) for _ in range(2000)}
    values = {v for v in values if 0 <= v <= 2**53}
    return sorted(values | {-v for v in values})


async def test_integers_given_as_numbers_are_written_exactly(redis: RespBackend) -> None:
    values = _values()
    for start in range(0, len(values), 1000):
        chunk = values[start : start + 1000]
        reply = await run(redis, PROBE, ["int:a", "int:b"], [str(v) for v in chunk])
        if reply == [-1]:
            pytest.skip("this server gets '%d' strings from the scripts, not numbers")
        assert reply == [], reply[:10]  # type: ignore[index]


def test_every_script_uses_the_same_condition() -> None:
    """The test above vouches for NUM only if the scripts use exactly this expression."""
    from importlib import resources

    users = 0
    for entry in resources.files("triogate.lua").iterdir():
        if not entry.name.endswith(".lua"):
            continue
        source = entry.read_text()
        if "local NUM = " in source:
            users += 1
            assert f"local NUM = {NUM}\n" in source, entry.name
    assert users > 0
