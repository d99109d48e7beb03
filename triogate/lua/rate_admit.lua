-- rate_admit.lua: check every rate window of one principal; count the request only if all pass.
--
-- KEYS[i]  window i of the principal, all with the principal's hash tag (governance/keys.py):
--            kind 'r' (requests) or 't' (tokens): HASH bucket (epoch second) -> count
--            kind 'p' (parallel requests):        ZSET request id -> lease expiry (epoch ms)
-- ARGV[1]  now_ms            epoch ms; time comes from ARGV, never from TIME, except that
--                            parallel slots' leases are judged by lease_clock(now_ms)
-- ARGV[2]  request_id
-- ARGV[3]  estimate_tokens   tokens reserved in 't' windows until settled (integer >= 0)
-- ARGV[4]  lease_ms          a parallel slot older than this belongs to a dead process (> 0)
-- ARGV[3+2i] kind of window i: 'r', 't' or 'p'
-- ARGV[4+2i] limit of window i (integer >= 0)
-- Returns  {admitted (1|0), failed (1-based index of the first failing window, 0 if none),
--           retry_after_ms (0 if admitted), remaining_1, ..., remaining_n}
--          remaining_i is what is left in window i after this request (admitted) or now
--          (rejected), never below 0.
--
-- Checks: 'r' count + 1 <= limit; 't' used + estimate <= limit, or used == 0 (one big request
-- is possible on an idle window); 'p' live slots + 1 <= limit (slots whose lease expired are
-- not live). Admitted only if every window passes; then 'r' +1 and 't' +estimate in the
-- current bucket, and 'p' holds a slot scored now + lease_ms. A rejection writes NOTHING.
--
-- Sliding window: 60 buckets of 1 s per window, summed over the buckets b with
-- b > floor(now_ms / 1000) - 60 (buckets "from the future", written by a gateway whose clock
-- runs ahead, count too). Why this shape: memory and work are bounded (at most 61 fields
-- per window), every count is exact (atomic increments, no approximation weights), and the
-- only imprecision is the bucket edge: a request leaves the window between 59 and 60 s after
-- it was counted, never later. A burst within one second is counted exactly, so processes
-- sharing Redis admit exactly `limit` requests. A sliding log (ZSET per request) would be
-- exact to the ms but cannot hold token counts and grows with the limit.
-- O(1) per check: besides its buckets, a window HASH keeps two fields, `t` = the sum of
-- every bucket field in the hash, and `o` = a bucket index no bucket field is below. A
-- check reads `t` and `o` (one HMGET) and subtracts the buckets in [o, oldest) (one HMGET
-- of the seconds that passed since the last admission: amortised one bucket); only a
-- window idle for over a minute, or written before `t` existed, is read whole (HGETALL)
-- and rebuilt. Old buckets are deleted, and `t`/`o` moved on, when a request is admitted
-- (only then is anything written); a rejection reads the buckets to compute the retry.
-- The check's HMGET also reads the current bucket, so an admission writes each window
-- with one HSET (bucket, `t`, `o`): exact, since the script runs atomically.
-- TTL: every write that creates a bucket field arms the window's TTL (WINDOW_TTL_MS, here
-- and in rate_settle.lua); a write to a bucket that exists leaves the TTL alone. The TTL
-- was thus armed no earlier than the start of the newest bucket's second: a window lives
-- at least WINDOW_TTL_MS - 1 s after its newest bucket began, twice the minute its buckets
-- count, and at most WINDOW_TTL_MS after it (never forever). Windows written by an older
-- version had their TTL re-armed on every admission, so they satisfy the same bound.

-- Globals are looked up in Redis's protected global table, ~200 instructions each: the
-- ones used often are aliased once (in a fused call KEYS and ARGV are locals already).
local call, KEYS, ARGV = redis.call, KEYS, ARGV

local BUCKET_MS = 1000
local BUCKETS = 60
local WINDOW_TTL_MS = 120000
local PARALLEL_RETRY_MS = 1000
local LIMIT = 9007199254740992
-- A field whose value is longer than hash-max-listpack-value (64 bytes by default) makes
-- Redis/Valkey store the hash as a hashtable: O(1) field lookups where a listpack (a
-- window holds up to 62 fields) is scanned per field of every HMGET/HSET. Written with
-- each new bucket (when the TTL is armed); not a bucket, skipped by every reader.
local PAD_FIELD, PAD = '~', '------------------------------------------------------------------------'
-- Integers go to redis.call as Lua numbers where the server prints them exactly and
-- cheaply, else as '%d' strings (see budget_reserve.lua): `NUM and x or fmt('%d', x)`.
local NUM = (redis.VALKEY_VERSION_NUM or 0) >= 0x080100
local fmt = string.format

-- Leases are judged by Redis's clock, never by a caller's that runs ahead of it: a gateway
-- whose clock is fast must not expire other gateways' live leases. A caller whose clock
-- is behind Redis's judges (and writes) by its own, which only purges later; holders
-- renew their leases while they run (lease_renew.lua). Redis 5+ replicates a script's
-- effects, so TIME may precede writes.
local function lease_clock(caller_ms)
  local t = call('TIME')
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

local n = #KEYS
local kinds, limits = {}, {}
local parsed, now_ms, estimate, lease_ms = pcall(function()
  for i = 1, n do limits[i] = int(4 + 2 * i, 0) end
  return int(1, 0), int(3, 0), int(4, 1)
end)
local ok_args = parsed and now_ms and estimate and lease_ms and #ARGV == 4 + 2 * n
for i = 1, n do
  kinds[i] = ARGV[3 + 2 * i]
  if not limits[i] or not (kinds[i] == 'r' or kinds[i] == 't' or kinds[i] == 'p') then
    ok_args = false
  end
end
if not ok_args then
  return redis.error_reply('ERR rate_admit: expected now_ms, request_id, estimate_tokens, '
    .. 'lease_ms (> 0), then a kind (r|t|p) and an integer limit >= 0 per key')
end
local request_id = ARGV[2]
-- TIME only when a parallel window needs leases judged (r/t windows take ARGV's clock).
local lease_now = nil
for i = 1, n do
  if kinds[i] == 'p' then lease_now = lease_clock(now_ms) break end
end
local current = (now_ms - now_ms % BUCKET_MS) / BUCKET_MS  -- floor (now_ms >= 0), no C call
local current_s = NUM and current or fmt('%d', current)
local oldest = current - BUCKETS + 1

-- Read every window: total in window (t after removing old buckets), the new `o`, and
-- the fields to drop when admitted.
local ROLL_MAX = 64
local used, origin, bucket_now = {}, {}, {}
local stale = false  -- a table only when some window has buckets to drop
for i = 1, n do
  if kinds[i] == 'p' then
    used[i] = call('ZCOUNT', KEYS[i], fmt('(%d', lease_now), '+inf')
  else
    local key = KEYS[i]
    local head = call('HMGET', key, 't', 'o', current_s)
    -- `x and x + 0`: one conversion (see int), false for a missing field.
    local total, low = head[1] and head[1] + 0, head[2] and head[2] + 0
    bucket_now[i] = head[3] and head[3] + 0
    local old = false  -- the stale fields, a table only when there are some
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
    else  -- no summary yet (a new or pre-summary window), or idle for over a minute
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

-- Which windows refuse the request, and how much must leave each (0: a parallel slot).
local failed, needs = 0, nil
for i = 1, n do
  local limit, u, need = limits[i], used[i], nil
  if kinds[i] == 'r' then
    if u + 1 > limit then need = u + 1 - limit end
  elseif kinds[i] == 't' then
    if u + estimate > limit and u > 0 then need = math.min(u, u + estimate - limit) end
  elseif u + 1 > limit then
    need = 0
  end
  if need then
    if failed == 0 then failed, needs = i, {} end
    needs[i] = need
  end
end

if failed > 0 then
  -- The window's buckets in the window, ascending. Defined only for a refusal: an
  -- admission creates no closure it does not call.
  local function buckets_of(i)
    local flat = call('HGETALL', KEYS[i])
    local list = {}
    for j = 1, #flat, 2 do
      local b = tonumber(flat[j])
      if b and b >= oldest then list[#list + 1] = {b, tonumber(flat[j + 1]) or 0} end
    end
    table.sort(list, function(x, y) return x[1] < y[1] end)
    return list
  end
  -- When will `need` units have left window i?
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
  local refused = {0, failed, retry_ms}
  for i = 1, n do refused[3 + i] = math.max(limits[i] - used[i], 0) end
  return refused
end

local result = {1, 0, 0}
for i = 1, n do
  local key = KEYS[i]
  if kinds[i] == 'p' then
    call('ZREMRANGEBYSCORE', key, '-inf', lease_now)
    call('ZADD', key, lease_now + lease_ms, request_id)
    call('PEXPIRE', key, lease_ms + WINDOW_TTL_MS)
    local left = limits[i] - used[i] - 1
    result[3 + i] = left > 0 and left or 0
  else
    local add = 1
    if kinds[i] == 't' then add = estimate end
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
        -- The TTL is armed by the write that creates a bucket (see the header); PAD too.
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
      call('DEL', key)  -- nothing left in the window
    elseif old or call('EXISTS', key) == 1 then
      call('HSET', key, 't', used[i], 'o', low)
    end
    local left = limits[i] - used[i] - add  -- math.max without its C call
    result[3 + i] = left > 0 and left or 0
  end
end
return result
