-- budget_settle.lua: settle one request at one principal's budget: release its reservation
-- and charge its actual cost to the period it was admitted in. Idempotent by request id.
--
-- KEYS[1]  counters HASH of the reservation's period: fields `spend`, `reserved` (nano-USD)
-- KEYS[2]  holds HASH of that period: request id -> reserved amount (nano-USD)
-- KEYS[3]  leases ZSET of that period: request id -> lease expiry (epoch ms)
-- KEYS[4]  settlement markers HASH of this principal's current slice: request id -> 1
--          All four carry the principal's hash tag (governance/keys.py).
-- ARGV[1]  request_id
-- ARGV[2]  actual_nanousd   cost to charge (integer >= 0; 0 = nothing was charged)
-- ARGV[3]  ttl_ms           TTL for KEYS[1..3] when written; 0 = none (lifetime budget)
-- ARGV[4]  marker_ttl_ms    how long the markers HASH lives from its first field (> 0)
-- Returns  {applied (1, or 0 for a replay), released_nanousd, spend_nanousd}
--
-- The marker is HSETNX'd inside this script: a replay (journal, retry) changes nothing.
-- A reservation already purged as expired (by budget_reserve) is simply absent: the
-- actual cost is still charged, and `reserved` was already reduced by the purge.
-- No time is needed (no ARGV now_ms, no TIME). The counters' TTL is armed only when no hold
-- was found (the counters may be created here), as in budget_reserve.lua.
-- Integers only for money: nano-USD, exact in Lua arithmetic up to 2^53.

local LIMIT = 9007199254740992
-- A field whose value is longer than hash-max-listpack-value (64 bytes by default) makes
-- Redis/Valkey store the hash as a hashtable: O(1) field lookups where a listpack (up to
-- hash-max-listpack-entries fields, 128 on Redis 7, 512 on Valkey 8) is scanned per
-- HSETNX/HMGET. Readers skip it (its name is not a request id or bucket).
local PAD_FIELD, PAD = '~', '------------------------------------------------------------------------'

-- An integer argument, converted once (Lua 5.1's tonumber converts twice, lua_isnumber then
-- lua_tonumber, each through the C library's strtod: ~11 % of a request's instructions).
-- `+ 0` raises on a non-number (or a missing argument): call it under pcall (parse below).
local function int(i, min)
  local v = ARGV[i] + 0
  if v % 1 == 0 and v >= min and v < LIMIT then return v end
  return nil
end

local ok, actual, ttl_ms, marker_ttl_ms = pcall(function()
  return int(2, 0), int(3, 0), int(4, 1)
end)
if not (ok and actual and ttl_ms and marker_ttl_ms) or #ARGV ~= 4 then
  return redis.error_reply('ERR budget_settle: expected 4 arguments: request_id, '
    .. 'actual_nanousd, ttl_ms, marker_ttl_ms (> 0), integers >= 0 but request_id')
end
local request_id = ARGV[1]

if redis.call('HSETNX', KEYS[4], request_id, '1') == 0 then
  local spent = redis.call('HGET', KEYS[1], 'spend')
  return {0, 0, spent and spent + 0 or 0}
end
-- The PAD field is written once per markers HASH: HSETNX says whether the hash was new
-- (then its TTL is armed; a hash an older version created gets it on its next settlement
-- and its TTL re-armed, which moves the expiry by less than a slice), and its long value
-- keeps the hash out of the listpack encoding, whose HSETNX is a linear scan (see PAD).
if redis.call('HSETNX', KEYS[4], PAD_FIELD, PAD) == 1 then
  redis.call('PEXPIRE', KEYS[4], marker_ttl_ms)
end

local released = 0
local amount = redis.call('HGET', KEYS[2], request_id)
if amount then
  released = amount + 0
  redis.call('HDEL', KEYS[2], request_id)
  redis.call('HINCRBY', KEYS[1], 'reserved', -released)
end
redis.call('ZREM', KEYS[3], request_id)

local spend
if actual > 0 then
  spend = redis.call('HINCRBY', KEYS[1], 'spend', actual)
  -- A hold existed, so did the counters, with their TTL (armed at creation, see
  -- budget_reserve.lua); otherwise this call may have created them.
  if ttl_ms > 0 and not amount then redis.call('PEXPIRE', KEYS[1], ttl_ms) end
else
  local spent = redis.call('HGET', KEYS[1], 'spend')
  spend = spent and spent + 0 or 0
end
return {1, released, spend}
