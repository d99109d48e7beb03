-- routing_state.lua: read one model group's routing state; optionally claim a
-- least-busy slot on the deployment with the fewest requests in flight.
--
-- Called once per group before the model call (triogate/routing/router.py), in the same
-- round as auth, budgets, rate limits and the cache. Every key is in the group's hash
-- tag {rt:<group>} (triogate/routing/keys.py), so one call touches one cluster slot.
--
-- KEYS[1]      usage hash of the current minute  tg:{rt:g}:usage:<minute>
--              fields rpm:<id>, tpm:<id>, fail:<id> (integers)
-- KEYS[2]      cooldown hash  tg:{rt:g}:cooldown   field <id> -> until (epoch ms)
-- KEYS[3]      latency hash   tg:{rt:g}:latency    field <id> -> EWMA (ms, decimal)
-- KEYS[3+i]    in-flight ZSET of deployment i: request id -> lease expiry (epoch ms)
--
-- ARGV[1]      now_ms: epoch ms. Time comes from ARGV, never from TIME, except that
--              claims' leases are judged by lease_clock(now_ms) (below).
-- ARGV[2]      mode: "read" (no writes at all) or "claim" (least-busy: claim a slot)
-- ARGV[3]      request id (the claim's ZSET member)
-- ARGV[4]      lease_ms: how long a claim outlives a process that never releases it
-- ARGV[5]      estimate_tokens: the request's estimated tokens, for TPM limits
-- ARGV[6]      offset: 0-based index where the claim's scan starts (the caller's RNG),
--              so ties are broken at random rather than always in favour of the first
-- ARGV[7+3(i-1) .. 9+3(i-1)]  deployment i: id, rpm limit, tpm limit (0 = no limit)
--
-- Eligible for a claim: not cooling down (until <= now), rpm used < rpm limit, and
-- tpm used < tpm limit with tpm used + estimate <= tpm limit, unless no tokens were used
-- this minute (a request larger than a whole minute's limit still goes to an idle
-- deployment). The same rule is cooldowns.under_limits in triogate/routing/cooldowns.py.
--
-- Returns: { claimed, then for each deployment i in order:
--            rpm, tpm, fails, cooldown_until_ms (0 = none or expired), in_flight,
--            latency_ms (string; "" = unknown) }
--          claimed is the 1-based index of the claimed deployment, 0 for none (read
--          mode, or nothing eligible). A request that already holds a live claim in
--          the group gets that one back (no second claim). in_flight counts live leases
--          (expiry > now), including the claim just made.
-- Integers only for counters; no money here.

-- Globals are looked up in Redis's protected global table, ~200 instructions each: the
-- ones used often are aliased once (in a fused call KEYS and ARGV are locals already).
local call, KEYS, ARGV = redis.call, KEYS, ARGV
local unpack = unpack  -- eight calls below

-- Integers go to redis.call as Lua numbers where the server prints them exactly and
-- cheaply, else as '%d' strings (see budget_reserve.lua): `NUM and x or fmt('%d', x)`.
local NUM = (redis.VALKEY_VERSION_NUM or 0) >= 0x080100
local fmt = string.format

local n = #KEYS - 3
-- `+ 0` converts once where tonumber converts twice (Lua 5.1: lua_isnumber, lua_tonumber).
local now = ARGV[1] + 0
local claim = ARGV[2] == 'claim'
local request_id = ARGV[3]
local lease_ms = ARGV[4] + 0
local estimate = ARGV[5] + 0
local offset = ARGV[6] + 0

-- Leases are judged by Redis's clock, never by a caller's that runs ahead of it: a gateway
-- whose clock is fast must not expire other gateways' live leases. A caller whose clock
-- is behind Redis's judges (and writes) by its own, which only purges later; holders
-- renew their leases while they run (lease_renew.lua). Redis 5+ replicates a script's
-- effects, so TIME may precede writes. lease_now = min(now, Redis's ms), inline.
-- In read mode an in-flight ZSET that does not exist counts 0 whatever the clock: one
-- EXISTS of the group's sets answers for all of them, and TIME and the ZCOUNTs run only
-- when some exist (groups routed by usage or latency never claim, so theirs never do;
-- TIME plus a ZCOUNT per deployment cost ~3 times the EXISTS).
local lease_now, live_after = nil, nil
local counted = claim or (n > 0 and call('EXISTS', unpack(KEYS, 4, 3 + n)) > 0)
if counted then
  local t = call('TIME')
  local us = t[2] + 0
  lease_now = t[1] * 1000 + (us - us % 1000) / 1000
  if now < lease_now then lease_now = now end
  if not claim then live_after = fmt('(%d', lease_now) end  -- not '(' .. n: '%.14g'
end

-- Arrays are sized once, by a constructor of unpack(ARGV, 1, size): Lua 5.1 has no
-- table.new, and an array grown slot by slot is rehashed at every power of two (~700
-- instructions each, 13 times here for two deployments). ARGV is only the filler: every
-- slot is written before it is read (past ARGV's end the filler is nil).
-- One HMGET per hash for the whole group (3 reads, whatever the number of deployments).
local ids, usage_fields = {unpack(ARGV, 1, n)}, {unpack(ARGV, 1, 3 * n)}
for i = 1, n do
  local id = ARGV[4 + 3 * i]
  ids[i] = id
  usage_fields[3 * i - 2] = 'rpm:' .. id
  usage_fields[3 * i - 1] = 'tpm:' .. id
  usage_fields[3 * i] = 'fail:' .. id
end
local usage, cooldowns, latencies = {}, {}, {}
if n > 0 then
  usage = call('HMGET', KEYS[1], unpack(usage_fields))
  cooldowns = call('HMGET', KEYS[2], unpack(ids))
  latencies = call('HMGET', KEYS[3], unpack(ids))
end

-- The reply is built in place: deployment i's six values at out[6i-4 .. 6i+1] (rpm, tpm,
-- fails, cooldown_until_ms, in_flight, latency), read back by the claim below; limits
-- go to one array (rpm, tpm per deployment). No table per deployment: a table with
-- named fields cost more than the lines that read it.
local out, limits = {unpack(ARGV, 1, 1 + 6 * n)}, {unpack(ARGV, 1, 2 * n)}
for i = 1, n do
  local base, k = 4 + 3 * i, 6 * i - 4
  limits[2 * i - 1], limits[2 * i] = ARGV[base + 1] + 0, ARGV[base + 2] + 0
  local x = usage[3 * i - 2]
  out[k] = x and x + 0 or 0
  x = usage[3 * i - 1]
  out[k + 1] = x and x + 0 or 0
  x = usage[3 * i]
  out[k + 2] = x and x + 0 or 0
  x = cooldowns[i]
  x = x and x + 0 or 0
  if x <= now then x = 0 end
  out[k + 3] = x
  if claim then
    -- A dead process's claims expire with their lease.
    call('ZREMRANGEBYSCORE', KEYS[3 + i], '-inf', lease_now)
    out[k + 4] = call('ZCARD', KEYS[3 + i])
  elseif counted then
    out[k + 4] = call('ZCOUNT', KEYS[3 + i], live_after, '+inf')
  else
    out[k + 4] = 0
  end
  out[k + 5] = latencies[i] or ''
end

local claimed = 0
if claim then
  -- A request holds at most one claim per group: claiming again returns the same one.
  for i = 1, n do
    if call('ZSCORE', KEYS[3 + i], request_id) then
      claimed = i
      break
    end
  end
end
if claim and claimed == 0 and n > 0 then
  local best = nil
  for j = 0, n - 1 do
    local i = ((offset + j) % n) + 1
    local k = 6 * i - 4
    local rpm, tpm = out[k], out[k + 1]
    local rpm_limit, tpm_limit = limits[2 * i - 1], limits[2 * i]
    local eligible = out[k + 3] == 0
      and (rpm_limit == 0 or rpm < rpm_limit)
      and (tpm_limit == 0 or tpm == 0
           or (tpm < tpm_limit and tpm + estimate <= tpm_limit))
    if eligible and (best == nil or out[k + 4] < out[6 * best]) then
      best = i
    end
  end
  if best ~= nil then
    local key = KEYS[3 + best]
    local expiry = lease_now + lease_ms
    call('ZADD', key, NUM and expiry or fmt('%d', expiry), request_id)
    call('PEXPIRE', key, lease_ms)
    out[6 * best] = call('ZCARD', key)
    claimed = best
  end
end
out[1] = claimed
return out
