-- budget_reserve.lua: check one principal's budget for one request and reserve its estimate.
--
-- KEYS[1]  counters HASH of the budget period: fields `spend`, `reserved` (nano-USD)
-- KEYS[2]  holds HASH of the period: request id -> reserved amount (nano-USD)
-- KEYS[3]  leases ZSET of the period: request id -> lease expiry (epoch ms)
--          All three carry the principal's hash tag (governance/keys.py).
-- ARGV[1]  now_ms              epoch ms; leases judged by lease_clock(now_ms) (below)
-- ARGV[2]  request_id
-- ARGV[3]  estimate_nanousd    amount to reserve (integer >= 0)
-- ARGV[4]  max_budget_nanousd  the period's budget (integer >= 0)
-- ARGV[5]  lease_ms            a reservation older than this belongs to a dead process (> 0)
-- ARGV[6]  ttl_ms              TTL given to the three keys; 0 = none (a lifetime budget)
-- Returns  {admitted (1|0), spend_nanousd, reserved_nanousd}; reserved includes this
--          request's estimate when admitted.
--
-- Rule: admit iff spend + reserved + estimate <= max_budget, EXCEPT that when nothing is
-- used yet (spend + reserved == 0) the request is admitted whenever spend < max_budget, so
-- one large max_tokens estimate cannot lock a fresh period out forever.
-- Expired leases are purged (and subtracted from `reserved`) before the check; a lease's
-- expiry is judged by Redis's clock, or the caller's when that is behind (lease_clock).
-- A request id that already holds a reservation is admitted again with no change, so a
-- retried call cannot reserve twice.
-- Integers only for money: nano-USD, exact in Lua arithmetic up to 2^53 (~9 million USD).
--
-- TTLs are armed when a key is created, not on every call: ttl_ms is the rest of the
-- period plus retention, so every caller names the same instant (period end + retention)
-- and re-arming it changed nothing. The counters HASH is new when HMGET finds neither
-- field (its fields are never deleted); the holds HASH and the leases ZSET always hold
-- the same request ids (written and removed together here, in budget_settle.lua and by
-- the purge), so both are new when the lease set is empty (ZRANGE finds no lowest lease),
-- and both are armed together with the same TTL. Keys written by an older version had
-- all three TTLs re-armed on every reservation, so they carry the same expiry. A lifetime
-- budget (ttl_ms = 0) arms nothing; its holds and leases are deleted when empty.

local LIMIT = 9007199254740992

-- Leases are judged by Redis's clock, never by a caller's that runs ahead of it: a gateway
-- whose clock is fast must not expire other gateways' live leases. A caller whose clock
-- is behind Redis's judges (and writes) by its own, which only purges later; holders
-- renew their leases while they run (lease_renew.lua). Redis 5+ replicates a script's
-- effects, so TIME may precede writes.
local function lease_clock(caller_ms)
  local t = redis.call('TIME')
  local us = t[2] + 0
  local server_ms = t[1] * 1000 + (us - us % 1000) / 1000
  if caller_ms < server_ms then return caller_ms end
  return server_ms
end

-- An integer argument, converted once (Lua 5.1's tonumber converts twice, lua_isnumber then
-- lua_tonumber, each through the C library's strtod: ~11 % of a request's instructions).
-- `+ 0` raises on a non-number (or a missing argument): call it under pcall (parse below).
local function int(i, min)
  local v = ARGV[i] + 0
  if v % 1 == 0 and v >= min and v < LIMIT then return v end
  return nil
end

local ok, now_ms, estimate, max_budget, lease_ms, ttl_ms = pcall(function()
  return int(1, 0), int(3, 0), int(4, 0), int(5, 1), int(6, 0)
end)
if not (ok and now_ms and estimate and max_budget and lease_ms and ttl_ms) or #ARGV ~= 6 then
  return redis.error_reply('ERR budget_reserve: expected 6 arguments: now_ms, request_id, '
    .. 'estimate, max_budget, lease_ms (> 0), ttl_ms, all integers >= 0 but request_id')
end
local request_id = ARGV[2]
local lease_now = lease_clock(now_ms)

-- The lowest lease says whether the lease set exists (and so the holds HASH: they hold the
-- same request ids) and whether any lease expired; only then is the set scanned.
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local holds_exist = #first > 0
if holds_exist and first[2] + 0 <= lease_now then
  -- Purge leases of processes that died while holding a reservation.
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', lease_now)
  for _, rid in ipairs(expired) do
    local amount = redis.call('HGET', KEYS[2], rid)
    if amount then
      redis.call('HINCRBY', KEYS[1], 'reserved', -tonumber(amount))
      redis.call('HDEL', KEYS[2], rid)
    end
    redis.call('ZREM', KEYS[3], rid)
  end
  holds_exist = false  -- the purge may have emptied (deleted) both: arm again
end

local state = redis.call('HMGET', KEYS[1], 'spend', 'reserved')
local counters_exist = state[1] or state[2]
-- `x and x + 0 or 0`: one conversion (see int); a field holds what these scripts wrote.
local spend = state[1] and state[1] + 0 or 0
local reserved = state[2] and state[2] + 0 or 0

local used = spend + reserved
if used + estimate > max_budget and not (used == 0 and spend < max_budget) then
  -- A request id that already holds a reservation is admitted again, even when over.
  if redis.call('HEXISTS', KEYS[2], request_id) == 1 then return {1, spend, reserved} end
  return {0, spend, reserved}
end

-- HSETNX writes nothing for a request id that already holds a reservation: a replay.
-- Integers go to redis.call as '%d' strings (a Lua number is written with '%.17g').
local estimate_s = string.format('%d', estimate)
if redis.call('HSETNX', KEYS[2], request_id, estimate_s) == 0 then
  return {1, spend, reserved}
end
redis.call('HINCRBY', KEYS[1], 'reserved', estimate_s)
redis.call('ZADD', KEYS[3], string.format('%d', lease_now + lease_ms), request_id)
if ttl_ms > 0 then
  local ttl_s = string.format('%d', ttl_ms)
  if not counters_exist then redis.call('PEXPIRE', KEYS[1], ttl_s) end
  if not holds_exist then
    redis.call('PEXPIRE', KEYS[2], ttl_s)
    redis.call('PEXPIRE', KEYS[3], ttl_s)
  end
end
return {1, spend, reserved + estimate}
