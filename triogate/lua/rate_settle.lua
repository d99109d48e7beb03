-- rate_settle.lua: settle one request at one principal's rate windows. Idempotent by request id.
--
-- KEYS[1..n] the principal's windows, as in rate_admit.lua ('r'/'t' HASH, 'p' ZSET)
-- KEYS[n+1]  settlement markers HASH of this principal's current slice: request id -> 1
--            All carry the principal's hash tag (governance/keys.py).
-- ARGV[1]  request_id
-- ARGV[2]  mode: 'a' admitted (the request ran, or was a cache hit): 't' bucket += actual -
--          estimate; 'u' undo (the request was rejected elsewhere): 'r' bucket -1 and 't'
--          bucket -estimate, as if never counted; 'x' release only (the admission was
--          decided without Redis, so whether it was counted here is unknown: counts are
--          left alone, which errs on the side of counting).
--          In every mode the parallel slot ('p') is released.
-- ARGV[3]  bucket            the bucket (epoch second) the request was counted in
-- ARGV[4]  estimate_tokens   reserved at admission (integer >= 0)
-- ARGV[5]  actual_tokens     used (integer >= 0)
-- ARGV[6]  now_ms            epoch ms; time comes from ARGV, never from TIME
-- ARGV[7]  marker_ttl_ms     how long the markers HASH lives from its first field (> 0)
-- ARGV[7+i] kind of window i: 'r', 't' or 'p'
-- Returns  1 if applied, 0 for a replay (the marker was there: nothing changes)
--
-- A principal that also settles a budget has this work done by budget_settle.lua, in the
-- same call and under the budget's marker (governance/settle.py); this script is sent for
-- the others. Keep the two copies of the rules below identical.
--
-- A bucket that has slid out of the window (bucket <= floor(now_ms/1000) - 60) is not
-- touched: its count no longer matters and it must not be re-created. A bucket never goes
-- below 0 (it is deleted at 0). The window's TTL is armed only by a write that creates a
-- bucket, as in rate_admit.lua, whose header states the rule and its bound.
-- Integers only.

-- Globals are looked up in Redis's protected global table, ~200 instructions each: the
-- ones used often are aliased once (in a fused call KEYS and ARGV are locals already).
local call, KEYS, ARGV = redis.call, KEYS, ARGV

local BUCKET_MS = 1000
local BUCKETS = 60
local WINDOW_TTL_MS = 120000
local LIMIT = 9007199254740992
-- A field whose value is longer than hash-max-listpack-value (64 bytes by default) makes
-- Redis/Valkey store the hash as a hashtable: O(1) field lookups where a listpack (up to
-- hash-max-listpack-entries fields, 128 on Redis 7, 512 on Valkey 8) is scanned per
-- HSETNX/HMGET. Readers skip it (its name is not a request id or bucket).
local PAD_FIELD, PAD = '~', '------------------------------------------------------------------------'
-- Integers go to redis.call as Lua numbers where the server prints them exactly and
-- cheaply, else as '%d' strings (see budget_reserve.lua): `NUM and x or fmt('%d', x)`.
local NUM = (redis.VALKEY_VERSION_NUM or 0) >= 0x080100
local fmt = string.format

-- An integer argument, converted once (Lua 5.1's tonumber converts twice, lua_isnumber then
-- lua_tonumber, each through the C library's strtod: ~11 % of a request's instructions).
-- `+ 0` raises on a non-number (or a missing argument): call it under pcall (parse below).
local function int(i, min)
  local v = ARGV[i] + 0
  if v % 1 == 0 and v >= min and v < LIMIT then return v end
  return nil
end

local n = #KEYS - 1
local mode = ARGV[2]
local parsed, bucket, estimate, actual, now_ms, marker_ttl_ms = pcall(function()
  return int(3, 0), int(4, 0), int(5, 0), int(6, 0), int(7, 1)
end)
local ok_args = parsed and n >= 0 and bucket and estimate and actual and now_ms and marker_ttl_ms
  and #ARGV == 7 + n and (mode == 'a' or mode == 'u' or mode == 'x')
for i = 1, math.max(n, 0) do
  local k = ARGV[7 + i]
  if not (k == 'r' or k == 't' or k == 'p') then ok_args = false end
end
if not ok_args then
  return redis.error_reply('ERR rate_settle: expected request_id, mode (a|u|x), bucket, '
    .. 'estimate_tokens, actual_tokens, now_ms, marker_ttl_ms (> 0), then a kind (r|t|p) per '
    .. 'window key; the marker key last')
end
local request_id = ARGV[1]

if call('HSETNX', KEYS[n + 1], request_id, '1') == 0 then
  return 0
end
-- The PAD field is written once per markers HASH: HSETNX says whether the hash was new
-- (then its TTL is armed; a hash an older version created gets it on its next settlement
-- and its TTL re-armed, which moves the expiry by less than a slice), and its long value
-- keeps the hash out of the listpack encoding, whose HSETNX is a linear scan (see PAD).
if call('HSETNX', KEYS[n + 1], PAD_FIELD, PAD) == 1 then
  call('PEXPIRE', KEYS[n + 1], marker_ttl_ms)
end

-- floor(now_ms / BUCKET_MS) without its C call (now_ms >= 0)
local in_window = bucket > (now_ms - now_ms % BUCKET_MS) / BUCKET_MS - BUCKETS
local bucket_s = NUM and bucket or fmt('%d', bucket)

-- Keeps the window's summary (see rate_admit.lua): `t` moves with the bucket; a bucket
-- below `o` has already been dropped from the window and is left alone.
local function adjust(key, delta)
  if delta == 0 or not in_window then return end
  local state = call('HMGET', key, bucket_s, 't', 'o')
  -- `x and x + 0`: one conversion (see int), false for a missing field.
  local low = state[3] and state[3] + 0
  if low and bucket < low then return end
  local before = state[1] and state[1] + 0 or 0
  local value = before + delta
  local total = state[2] and state[2] + 0
  if value > 0 then
    if not NUM then value = fmt('%d', value) end
    if total then
      local t = total + delta
      call('HSET', key, bucket_s, value, 't', NUM and t or fmt('%d', t))
    else
      call('HSET', key, bucket_s, value)
    end
    -- Only a write that creates the bucket arms the TTL (the rule of rate_admit.lua).
    if not state[1] then call('PEXPIRE', key, WINDOW_TTL_MS) end
  else
    call('HDEL', key, bucket_s)
    if total and total - before <= 0 then
      call('DEL', key)  -- no bucket left: no trace
    elseif total then
      call('HSET', key, 't', total - before)
    end
  end
end

for i = 1, n do
  local kind = ARGV[7 + i]
  if kind == 'p' then
    call('ZREM', KEYS[i], request_id)
  elseif mode == 'u' then
    if kind == 'r' then adjust(KEYS[i], -1) else adjust(KEYS[i], -estimate) end
  elseif mode == 'a' and kind == 't' then
    adjust(KEYS[i], actual - estimate)
  end
end
return 1
