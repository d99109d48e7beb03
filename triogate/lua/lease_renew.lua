-- lease_renew.lua: a request still running renews its leases at one principal, so a call or
-- a stream longer than the lease keeps its reservations and its parallel slot.
--
-- KEYS[i]  lease ZSETs of one principal holding the request (budget leases of a period,
--          the parallel-requests window): request id -> lease expiry (epoch ms).
--          All carry the principal's hash tag (governance/keys.py).
-- ARGV[1]  request_id
-- ARGV[2]  now_ms        epoch ms; judged by lease_clock(now_ms), as in budget_reserve.lua
-- ARGV[3]  lease_ms      the new lease runs lease_ms from now (> 0)
-- ARGV[3+i] keep_ms      key i lives at least this long from now (0: leave its TTL alone)
-- Returns  the number of leases renewed.
--
-- Only a lease the request still holds is renewed (one purged as expired is gone, and its
-- reservation with it: settlement then charges the actual cost alone). A lease is never
-- shortened.

local LIMIT = 9007199254740992

-- An integer argument, converted once (Lua 5.1's tonumber converts twice, lua_isnumber then
-- lua_tonumber, each through the C library's strtod: ~11 % of a request's instructions).
-- `+ 0` raises on a non-number (or a missing argument): call it under pcall (parse below).
local function int(i, min)
  local v = ARGV[i] + 0
  if v % 1 == 0 and v >= min and v < LIMIT then return v end
  return nil
end

-- Leases are judged by Redis's clock, never by a caller's that runs ahead of it (see
-- budget_reserve.lua).
local function lease_clock(caller_ms)
  local t = redis.call('TIME')
  local us = t[2] + 0
  local server_ms = t[1] * 1000 + (us - us % 1000) / 1000
  if caller_ms < server_ms then return caller_ms end
  return server_ms
end

local n = #KEYS
local keeps = {}
local parsed, now_ms, lease_ms = pcall(function()
  for i = 1, n do keeps[i] = int(3 + i, 0) end
  return int(2, 0), int(3, 1)
end)
local ok_args = parsed and now_ms and lease_ms and #ARGV == 3 + n and n > 0
for i = 1, n do
  if not keeps[i] then ok_args = false end
end
if not ok_args then
  return redis.error_reply('ERR lease_renew: expected request_id, now_ms, lease_ms (> 0), '
    .. 'then an integer keep_ms >= 0 per key')
end
local request_id = ARGV[1]
local expiry = lease_clock(now_ms) + lease_ms

local renewed = 0
for i = 1, n do
  local key = KEYS[i]
  local score = redis.call('ZSCORE', key, request_id)
  if score then
    if tonumber(score) < expiry then redis.call('ZADD', key, expiry, request_id) end
    renewed = renewed + 1
    local keep = keeps[i]
    if keep > 0 then
      local ttl = redis.call('PTTL', key)
      if ttl >= 0 and ttl < keep then redis.call('PEXPIRE', key, keep) end
    end
  end
end
return renewed
