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
-- No time is needed (no ARGV now_ms, no TIME). The counters' TTL is armed only when this
-- call creates them (a purged reservation of a period whose keys expired), as in
-- budget_reserve.lua; a settlement that charges and releases nothing writes nothing.
-- Integers only for money: nano-USD, exact in Lua arithmetic up to 2^53.

local LIMIT = 9007199254740992

local function int(i, min)
  local v = tonumber(ARGV[i])
  if v and v == math.floor(v) and v >= min and v < LIMIT then return v end
  return nil
end

local actual, ttl_ms, marker_ttl_ms = int(2, 0), int(3, 0), int(4, 1)
if not (actual and ttl_ms and marker_ttl_ms) or #ARGV ~= 4 then
  return redis.error_reply('ERR budget_settle: expected 4 arguments: request_id, '
    .. 'actual_nanousd, ttl_ms, marker_ttl_ms (> 0), integers >= 0 but request_id')
end
local request_id = ARGV[1]

if redis.call('HSETNX', KEYS[4], request_id, '1') == 0 then
  return {0, 0, tonumber(redis.call('HGET', KEYS[1], 'spend')) or 0}
end
if redis.call('HLEN', KEYS[4]) == 1 then redis.call('PEXPIRE', KEYS[4], marker_ttl_ms) end

local released = nil
local amount = redis.call('HGET', KEYS[2], request_id)
if amount then
  released = tonumber(amount)
  redis.call('HDEL', KEYS[2], request_id)
end
redis.call('ZREM', KEYS[3], request_id)

-- One read and one write of the counters (exact: the script runs atomically).
local state = redis.call('HMGET', KEYS[1], 'spend', 'reserved')
local spend = tonumber(state[1]) or 0
local fields = {}
if released then
  local reserved = (tonumber(state[2]) or 0) - released
  fields[#fields + 1] = 'reserved'
  fields[#fields + 1] = string.format('%d', reserved)
end
if actual > 0 then
  spend = spend + actual
  fields[#fields + 1] = 'spend'
  fields[#fields + 1] = string.format('%d', spend)
end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
  -- Only a counters HASH this call created needs a TTL (see budget_reserve.lua).
  if ttl_ms > 0 and not (state[1] or state[2]) then redis.call('PEXPIRE', KEYS[1], ttl_ms) end
end
return {1, released or 0, spend}
