-- budget_reserve.lua: check one principal's budget for one request and reserve its estimate;
-- optionally check and count the same principal's rate windows in the same call.
--
-- KEYS[1]  counters HASH of the budget period: fields `spend`, `reserved` (nano-USD)
-- KEYS[2]  holds HASH of the period: request id -> reserved amount (nano-USD)
-- KEYS[3]  leases ZSET of the period: request id -> lease expiry (epoch ms)
-- KEYS[3+i] optional: window i of the same principal's rate windows, admitted in the same
--          call (the work of rate_admit.lua, the same code), as in rate_admit.lua ('r'/'t'
--          HASH, 'p' ZSET)
--          All carry the principal's hash tag (governance/keys.py).
-- ARGV[1]  now_ms              epoch ms; leases judged by lease_clock(now_ms) (below)
-- ARGV[2]  request_id
-- ARGV[3]  estimate_nanousd    amount to reserve (integer >= 0)
-- ARGV[4]  max_budget_nanousd  the period's budget (integer >= 0)
-- ARGV[5]  lease_ms            a reservation older than this belongs to a dead process (> 0)
-- ARGV[6]  ttl_ms              TTL given to the three keys; 0 = none (a lifetime budget)
-- With rate windows (KEYS[4..]), rate_admit.lua's own arguments follow (see its header;
-- now_ms, request_id and lease_ms are the ones above):
-- ARGV[7]  estimate_tokens;  ARGV[6+2i] kind of window i ('r', 't' or 'p');
-- ARGV[7+2i] limit of window i
-- Returns  {admitted (1|0), spend_nanousd, reserved_nanousd}; reserved includes this
--          request's estimate when admitted.
--          With rate windows, rate_admit.lua's reply follows in the same array:
--          {admitted, spend, reserved, rate admitted, failed, retry_after_ms, remaining_1..n};
--          a part whose arguments are refused is ONE element instead, the error reply its
--          lone script would have given (nested: {err, rate part...} or {budget part..., err}),
--          and the other part runs as it would have alone.
--
-- Why both in one script: before the call a principal with a budget and rate limits (a
-- key or a team) sent two scripts; one saves a script call, an argument parse, a TIME and
-- a reply per principal. Without KEYS[4..] and ARGV[7..] the script is exactly what it was
-- (a gateway of an older version reserves that way; both read and write the same keys).
-- The two parts decide independently, as the two scripts did: a budget refusal does not
-- keep the windows from counting, nor the reverse (settlement gives back what a rejected
-- request counted or reserved).
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

-- Globals are looked up in Redis's protected global table, ~200 instructions each: the
-- ones used often are aliased once (in a fused call KEYS and ARGV are locals already).
local call, KEYS, ARGV = redis.call, KEYS, ARGV

local LIMIT = 9007199254740992
local BUCKET_MS, BUCKETS, WINDOW_TTL_MS = 1000, 60, 120000  -- as in rate_admit.lua
local PARALLEL_RETRY_MS = 1000
-- A window's field that keeps it out of the listpack encoding (see rate_admit.lua).
local PAD_FIELD, PAD = '~', '------------------------------------------------------------------------'
-- Integers go to redis.call as Lua numbers where the server writes an integer-valued
-- number with its integer printer (Valkey 8.1+: ll2string, exact below 2^53, ~200
-- instructions), else as '%d' strings (Redis 7.0 writes '%.17g', glibc's float printf,
-- ~3,600 instructions against ~1,800 for string.format; Redis 7.2.0-7.2.4 wrote 1e+08):
-- `NUM and x or fmt('%d', x)`. The test suite checks the integer printer's exactness.
local NUM = (redis.VALKEY_VERSION_NUM or 0) >= 0x080100
local fmt = string.format

local n = #KEYS - 3  -- rate windows admitted with the budget
local rated = n > 0 or #ARGV > 6
-- Per-window arrays are built by constructors sized for three windows (a principal's r,
-- t and p): a table that grows is rehashed at every power of two, ~500 instructions each.
local limits = {false, false, false}
-- Integer arguments converted once each with `+ 0` (Lua 5.1's tonumber converts twice,
-- lua_isnumber then lua_tonumber, each through strtod), which raises on a non-number or
-- a missing argument: hence one pcall around the conversions, and the checks after it.
local ok, now_ms, lease_ms, estimate, max_budget, ttl_ms, estimate_tokens = pcall(function()
  if rated then
    for i = 1, n do limits[i] = ARGV[7 + 2 * i] + 0 end
    return ARGV[1] + 0, ARGV[5] + 0, ARGV[3] + 0, ARGV[4] + 0, ARGV[6] + 0, ARGV[7] + 0
  end
  return ARGV[1] + 0, ARGV[5] + 0, ARGV[3] + 0, ARGV[4] + 0, ARGV[6] + 0
end)
if ok then
  -- int() written out: a Lua call per argument costs more than its check.
  if not (now_ms % 1 == 0 and now_ms >= 0 and now_ms < LIMIT) then now_ms = nil end
  if not (lease_ms % 1 == 0 and lease_ms >= 1 and lease_ms < LIMIT) then lease_ms = nil end
  if not (estimate % 1 == 0 and estimate >= 0 and estimate < LIMIT) then estimate = nil end
  if not (max_budget % 1 == 0 and max_budget >= 0 and max_budget < LIMIT) then
    max_budget = nil
  end
  if not (ttl_ms % 1 == 0 and ttl_ms >= 0 and ttl_ms < LIMIT) then ttl_ms = nil end
  if rated then
    local v = estimate_tokens
    if not (v % 1 == 0 and v >= 0 and v < LIMIT) then estimate_tokens = nil end
    for i = 1, n do
      v = limits[i]
      if not (v % 1 == 0 and v >= 0 and v < LIMIT) then limits[i] = nil end
    end
  end
else
  -- A non-number somewhere: which part's? Each argument alone (a refusal's slow path).
  local function safe(i, min)
    local good, v = pcall(function() return ARGV[i] + 0 end)
    if good and v % 1 == 0 and v >= min and v < LIMIT then return v end
    return nil
  end
  now_ms, lease_ms, estimate, max_budget, ttl_ms = safe(1, 0), safe(5, 1), safe(3, 0),
    safe(4, 0), safe(6, 0)
  if rated then
    estimate_tokens = safe(7, 0)
    for i = 1, n do limits[i] = safe(7 + 2 * i, 0) end
  end
end
local budget_ok = now_ms and lease_ms and estimate and max_budget and ttl_ms
  and (rated or #ARGV == 6)
-- The refusal's text in two constants joined only when refusing: a `..` on every call
-- made a 150-byte string (hashed, then collected), ~1,000 instructions.
local REFUSAL_1, REFUSAL_2 = 'ERR budget_reserve: expected 6 arguments: now_ms, request_id, ',
  'estimate, max_budget, lease_ms (> 0), ttl_ms, all integers >= 0 but request_id'
if not rated and not budget_ok then return redis.error_reply(REFUSAL_1 .. REFUSAL_2) end
local kinds = {false, false, false}
local rate_ok = rated and now_ms and lease_ms and estimate_tokens and n > 0
  and #ARGV == 6 + 1 + 2 * n
local parallel = false
if rated then
  for i = 1, n do
    local kind = ARGV[6 + 2 * i]
    kinds[i] = kind
    if kind == 'p' then parallel = true end
    if not limits[i] or not (kind == 'r' or kind == 't' or kind == 'p') then
      rate_ok = false
    end
  end
end
local request_id = ARGV[2]
-- Leases are judged by Redis's clock, never by a caller's that runs ahead of it: a gateway
-- whose clock is fast must not expire other gateways' live leases. A caller whose clock
-- is behind Redis's judges (and writes) by its own, which only purges later; holders
-- renew their leases while they run (lease_renew.lua). Redis 5+ replicates a script's
-- effects, so TIME may precede writes. lease_now = min(now_ms, Redis's ms), inline (a
-- closure per call costs more than the lines): for the budget, or when a parallel window
-- needs leases judged (rate_admit.lua: TIME only then).
local lease_now = nil
if budget_ok or (rate_ok and parallel) then
  local t = call('TIME')
  local us = t[2] + 0
  lease_now = t[1] * 1000 + (us - us % 1000) / 1000
  if now_ms < lease_now then lease_now = now_ms end
end

-- The budget: the reply's first three elements (or the refusal).
local out
if not budget_ok then
  out = {redis.error_reply(REFUSAL_1 .. REFUSAL_2)}
else
  -- The lowest lease says whether the lease set exists (and so the holds HASH: they hold
  -- the same request ids) and whether any lease expired; only then is the set scanned.
  local first = call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  local holds_exist = #first > 0
  if holds_exist and first[2] + 0 <= lease_now then
    -- Purge leases of processes that died while holding a reservation.
    local expired = call('ZRANGEBYSCORE', KEYS[3], '-inf', lease_now)
    for _, rid in ipairs(expired) do
      local amount = call('HGET', KEYS[2], rid)
      if amount then
        -- 0 - x, not -x: a zero hold would be -0, which Redis 7.0 writes '-0' and HINCRBY
        -- refuses (Valkey writes 0).
        call('HINCRBY', KEYS[1], 'reserved', 0 - tonumber(amount))
        call('HDEL', KEYS[2], rid)
      end
      call('ZREM', KEYS[3], rid)
    end
    holds_exist = false  -- the purge may have emptied (deleted) both: arm again
  end

  local state = call('HMGET', KEYS[1], 'spend', 'reserved')
  local counters_exist = state[1] or state[2]
  -- `x and x + 0 or 0`: one conversion (see int); a field holds what these scripts wrote.
  local spend = state[1] and state[1] + 0 or 0
  local reserved = state[2] and state[2] + 0 or 0

  local used = spend + reserved
  if used + estimate > max_budget and not (used == 0 and spend < max_budget) then
    -- A request id that already holds a reservation is admitted again, even when over.
    if call('HEXISTS', KEYS[2], request_id) == 1 then
      out = {1, spend, reserved}
    else
      out = {0, spend, reserved}
    end
  else
    -- HSETNX writes nothing for a request id that already holds a reservation: a replay.
    local estimate_s = NUM and estimate or fmt('%d', estimate)
    if call('HSETNX', KEYS[2], request_id, estimate_s) == 0 then
      out = {1, spend, reserved}
    else
      call('HINCRBY', KEYS[1], 'reserved', estimate_s)
      local expiry = lease_now + lease_ms
      call('ZADD', KEYS[3], NUM and expiry or fmt('%d', expiry), request_id)
      if ttl_ms > 0 then
        local ttl_s = NUM and ttl_ms or fmt('%d', ttl_ms)
        if not counters_exist then call('PEXPIRE', KEYS[1], ttl_s) end
        if not holds_exist then
          call('PEXPIRE', KEYS[2], ttl_s)
          call('PEXPIRE', KEYS[3], ttl_s)
        end
      end
      out = {1, spend, reserved + estimate}
    end
  end
end
if not rated then return out end
if not rate_ok then
  out[#out + 1] = redis.error_reply('ERR rate_admit: expected now_ms, request_id, '
    .. 'estimate_tokens, lease_ms (> 0), then a kind (r|t|p) and an integer limit >= 0 per key')
  return out
end

-- The rate windows: rate_admit.lua's work, the same code (its header states the rules;
-- keep the two identical), with window i at KEYS[3 + i]; appended to `out` from `base`.
local base = #out
local estimate_t = estimate_tokens
local current = (now_ms - now_ms % BUCKET_MS) / BUCKET_MS  -- floor (now_ms >= 0), no C call
local current_s = NUM and current or fmt('%d', current)
local oldest = current - BUCKETS + 1
local ROLL_MAX = 64
local used, origin, bucket_now = {0, 0, 0}, {0, 0, 0}, {false, false, false}
local stale = false  -- a table only when some window has buckets to drop
for i = 1, n do
  if kinds[i] == 'p' then
    used[i] = call('ZCOUNT', KEYS[3 + i], fmt('(%d', lease_now), '+inf')
  else
    local key = KEYS[3 + i]
    local head = call('HMGET', key, 't', 'o', current_s)
    local total, low = head[1] and head[1] + 0, head[2] and head[2] + 0
    bucket_now[i] = head[3] and head[3] + 0
    local old = false
    if total and low and oldest - low <= ROLL_MAX then
      if low < oldest then
        local fields = {}
        for b = low, oldest - 1 do fields[#fields + 1] = b end
        local counts = call('HMGET', key, unpack(fields))
        for j = 1, #fields do
          local c = tonumber(counts[j])
          if c then
            total = total - c
            old = old or {}
            old[#old + 1] = fields[j]
          end
        end
        low = oldest
      end
    else
      local flat = call('HGETALL', key)
      total, low = 0, oldest
      for j = 1, #flat, 2 do
        local name = flat[j]
        local b, c = tonumber(name), tonumber(flat[j + 1]) or 0
        if b and b >= oldest then
          total = total + c
          if b < low then low = b end
          if b == current then bucket_now[i] = c end
        elseif name ~= 't' and name ~= 'o' and name ~= PAD_FIELD then
          old = old or {}
          old[#old + 1] = name
        end
      end
    end
    used[i], origin[i] = total, low
    if old then
      stale = stale or {}
      stale[i] = old
    end
  end
end

local failed, needs = 0, nil
for i = 1, n do
  local limit, u, need = limits[i], used[i], nil
  if kinds[i] == 'r' then
    if u + 1 > limit then need = u + 1 - limit end
  elseif kinds[i] == 't' then
    if u + estimate_t > limit and u > 0 then need = math.min(u, u + estimate_t - limit) end
  elseif u + 1 > limit then
    need = 0
  end
  if need then
    if failed == 0 then failed, needs = i, {} end
    needs[i] = need
  end
end

if failed > 0 then
  local function buckets_of(i)
    local flat = call('HGETALL', KEYS[3 + i])
    local list = {}
    for j = 1, #flat, 2 do
      local b = tonumber(flat[j])
      if b and b >= oldest then list[#list + 1] = {b, tonumber(flat[j + 1]) or 0} end
    end
    table.sort(list, function(x, y) return x[1] < y[1] end)
    return list
  end
  local function retry_after(i, need)
    local freed = 0
    for _, bc in ipairs(buckets_of(i)) do
      freed = freed + bc[2]
      if freed >= need then return (bc[1] + BUCKETS) * BUCKET_MS - now_ms end
    end
    return BUCKETS * BUCKET_MS
  end
  local retry_ms = 0
  for i = 1, n do
    local need = needs[i]
    if need then
      local wait = PARALLEL_RETRY_MS
      if kinds[i] ~= 'p' then wait = retry_after(i, need) end
      if wait > retry_ms then retry_ms = wait end
    end
  end
  out[base + 1], out[base + 2], out[base + 3] = 0, failed, retry_ms
  for i = 1, n do out[base + 3 + i] = math.max(limits[i] - used[i], 0) end
  return out
end

out[base + 1], out[base + 2], out[base + 3] = 1, 0, 0
for i = 1, n do
  local key = KEYS[3 + i]
  if kinds[i] == 'p' then
    call('ZREMRANGEBYSCORE', key, '-inf', lease_now)
    call('ZADD', key, lease_now + lease_ms, request_id)
    call('PEXPIRE', key, lease_ms + WINDOW_TTL_MS)
    local left = limits[i] - used[i] - 1
    out[base + 3 + i] = left > 0 and left or 0
  else
    local add = 1
    if kinds[i] == 't' then add = estimate_t end
    local old = stale and stale[i]
    if old then call('HDEL', key, unpack(old)) end
    local low = origin[i]
    if current < low then low = current end  -- a clock running behind
    if add > 0 then
      local before = bucket_now[i]
      if before then
        local b, t = before + add, used[i] + add
        if NUM then
          call('HSET', key, current_s, b, 't', t, 'o', low)
        else
          call('HSET', key, current_s, fmt('%d', b), 't', fmt('%d', t), 'o', fmt('%d', low))
        end
      else
        local t = used[i] + add
        if NUM then
          call('HSET', key, current_s, add, 't', t, 'o', low, PAD_FIELD, PAD)
        else
          call('HSET', key, current_s, fmt('%d', add), 't', fmt('%d', t),
            'o', fmt('%d', low), PAD_FIELD, PAD)
        end
        call('PEXPIRE', key, WINDOW_TTL_MS)
      end
    elseif used[i] == 0 then
      call('DEL', key)
    elseif old or call('EXISTS', key) == 1 then
      call('HSET', key, 't', used[i], 'o', low)
    end
    local left = limits[i] - used[i] - add  -- math.max without its C call
    out[base + 3 + i] = left > 0 and left or 0
  end
end
return out
