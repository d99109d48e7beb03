-- budget_settle.lua: settle one request at one principal's budget: release its reservation
-- and charge its actual cost to the period it was admitted in. Idempotent by request id.
--
-- KEYS[1]  counters HASH of the reservation's period: fields `spend`, `reserved` (nano-USD)
-- KEYS[2]  holds HASH of that period: request id -> reserved amount (nano-USD)
-- KEYS[3]  leases ZSET of that period: request id -> lease expiry (epoch ms)
-- KEYS[4]  settlement markers HASH of this principal's current slice: request id -> 1
-- KEYS[4+i] optional: window i of the same principal's rate windows, settled in the same
--          call (the work of rate_settle.lua, guarded by the same marker), as in
--          rate_admit.lua ('r'/'t' HASH, 'p' ZSET)
--          All carry the principal's hash tag (governance/keys.py).
-- ARGV[1]  request_id
-- ARGV[2]  actual_nanousd   cost to charge (integer >= 0; 0 = nothing was charged)
-- ARGV[3]  ttl_ms           TTL for KEYS[1..3] when written; 0 = none (lifetime budget)
-- ARGV[4]  marker_ttl_ms    how long the markers HASH lives from its first field (> 0)
-- With rate windows (KEYS[5..]), the arguments of rate_settle.lua follow (see its header):
-- ARGV[5]  mode 'a' | 'u' | 'x';  ARGV[6] bucket;  ARGV[7] estimate_tokens;
-- ARGV[8]  actual_tokens;  ARGV[9] now_ms;  ARGV[9+i] kind of window i ('r', 't' or 'p')
-- Returns  {applied (1, or 0 for a replay), released_nanousd, spend_nanousd}
--
-- Why both in one script: a request settles a principal's budget and its rate windows
-- together; one call instead of two saves a script call, an argument parse and a marker
-- (HSETNX + PAD) per principal, about a tenth of a governed request's Redis work.
-- Without KEYS[5..] and ARGV[5..] the script is exactly what it was before (a gateway of
-- an older version settles that way; both read and write the same keys).
--
-- The marker is HSETNX'd inside this script: a replay (journal, retry) changes nothing,
-- neither at the budget nor at the windows.
-- A reservation already purged as expired (by budget_reserve) is simply absent: the
-- actual cost is still charged, and `reserved` was already reduced by the purge.
-- No time is needed (no ARGV now_ms, no TIME). The counters' TTL is armed only when no hold
-- was found (the counters may be created here), as in budget_reserve.lua.
-- Integers only for money: nano-USD, exact in Lua arithmetic up to 2^53.

-- Globals are looked up in Redis's protected global table, ~200 instructions each: the
-- ones used often are aliased once (in a fused call KEYS and ARGV are locals already).
local call, KEYS, ARGV = redis.call, KEYS, ARGV

local LIMIT = 9007199254740992
local BUCKET_MS, BUCKETS, WINDOW_TTL_MS = 1000, 60, 120000  -- as in rate_settle.lua
-- A field whose value is longer than hash-max-listpack-value (64 bytes by default) makes
-- Redis/Valkey store the hash as a hashtable: O(1) field lookups where a listpack (up to
-- hash-max-listpack-entries fields, 128 on Redis 7, 512 on Valkey 8) is scanned per
-- HSETNX/HMGET. Readers skip it (its name is not a request id or bucket).
local PAD_FIELD, PAD = '~', '------------------------------------------------------------------------'

-- Integers go to redis.call as Lua numbers where the server prints them exactly and
-- cheaply, else as '%d' strings (see budget_reserve.lua): `NUM and x or fmt('%d', x)`.
local NUM = (redis.VALKEY_VERSION_NUM or 0) >= 0x080100
local fmt = string.format

-- Integer arguments converted once each with `+ 0` (Lua 5.1's tonumber converts twice,
-- lua_isnumber then lua_tonumber, each through strtod), which raises on a non-number or
-- a missing argument: one pcall around the conversions, the checks after it (written
-- out: a Lua call per argument costs more than its check).
local n = #KEYS - 4  -- rate windows settled with the budget
local rated = n > 0 or #ARGV > 4
local ok, actual, ttl_ms, marker_ttl_ms, bucket, estimate_tokens, actual_tokens, now_ms =
  pcall(function()
    if rated then
      return ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0, ARGV[6] + 0, ARGV[7] + 0, ARGV[8] + 0,
        ARGV[9] + 0
    end
    return ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0
  end)
if ok then
  if not (actual % 1 == 0 and actual >= 0 and actual < LIMIT) then actual = nil end
  if not (ttl_ms % 1 == 0 and ttl_ms >= 0 and ttl_ms < LIMIT) then ttl_ms = nil end
  if not (marker_ttl_ms % 1 == 0 and marker_ttl_ms >= 1 and marker_ttl_ms < LIMIT) then
    marker_ttl_ms = nil
  end
  if rated then
    if not (bucket % 1 == 0 and bucket >= 0 and bucket < LIMIT) then bucket = nil end
    local v = estimate_tokens
    if not (v % 1 == 0 and v >= 0 and v < LIMIT) then estimate_tokens = nil end
    v = actual_tokens
    if not (v % 1 == 0 and v >= 0 and v < LIMIT) then actual_tokens = nil end
    if not (now_ms % 1 == 0 and now_ms >= 0 and now_ms < LIMIT) then now_ms = nil end
  end
end
local mode = ARGV[5]
local ok_args = ok and actual and ttl_ms and marker_ttl_ms and n >= 0
if rated then
  ok_args = ok_args and bucket and estimate_tokens and actual_tokens and now_ms and n > 0
    and #ARGV == 9 + n and (mode == 'a' or mode == 'u' or mode == 'x')
  for i = 1, n do
    local k = ARGV[9 + i]
    if not (k == 'r' or k == 't' or k == 'p') then ok_args = false end
  end
else
  ok_args = ok_args and #ARGV == 4
end
if not ok_args then
  return redis.error_reply('ERR budget_settle: expected 4 arguments: request_id, '
    .. 'actual_nanousd, ttl_ms, marker_ttl_ms (> 0), integers >= 0 but request_id; with '
    .. 'rate window keys, then mode (a|u|x), bucket, estimate_tokens, actual_tokens, now_ms '
    .. 'and a kind (r|t|p) per window')
end
local request_id = ARGV[1]

if call('HSETNX', KEYS[4], request_id, '1') == 0 then
  local spent = call('HGET', KEYS[1], 'spend')
  return {0, 0, spent and spent + 0 or 0}
end
-- The PAD field is written once per markers HASH: HSETNX says whether the hash was new
-- (then its TTL is armed; a hash an older version created gets it on its next settlement
-- and its TTL re-armed, which moves the expiry by less than a slice), and its long value
-- keeps the hash out of the listpack encoding, whose HSETNX is a linear scan (see PAD).
if call('HSETNX', KEYS[4], PAD_FIELD, PAD) == 1 then
  call('PEXPIRE', KEYS[4], marker_ttl_ms)
end

-- The rate windows (rate_settle.lua's work, the same code; its header states the rules;
-- keep the two identical): a bucket that
-- slid out of the window is not touched, a bucket never goes below 0, `t` moves with the
-- bucket, a bucket below `o` is left alone, and only a write that creates a bucket arms
-- the window's TTL.
if rated then
  -- floor(now_ms / BUCKET_MS) without its C call (now_ms >= 0)
  local in_window = bucket > (now_ms - now_ms % BUCKET_MS) / BUCKET_MS - BUCKETS
  local bucket_s = NUM and bucket or fmt('%d', bucket)
  local function adjust(key, delta)
    if delta == 0 or not in_window then return end
    local state = call('HMGET', key, bucket_s, 't', 'o')
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
      if not state[1] then call('PEXPIRE', key, WINDOW_TTL_MS) end
    else
      call('HDEL', key, bucket_s)
      if total and total - before <= 0 then
        call('DEL', key)
      elseif total then
        call('HSET', key, 't', total - before)
      end
    end
  end
  for i = 1, n do
    local kind, key = ARGV[9 + i], KEYS[4 + i]
    if kind == 'p' then
      call('ZREM', key, request_id)
    elseif mode == 'u' then
      if kind == 'r' then adjust(key, -1) else adjust(key, -estimate_tokens) end
    elseif mode == 'a' and kind == 't' then
      adjust(key, actual_tokens - estimate_tokens)
    end
  end
end

local released = 0
local amount = call('HGET', KEYS[2], request_id)
if amount then
  released = amount + 0
  call('HDEL', KEYS[2], request_id)
  -- 0 - x, not -x: a zero hold would be -0, which Redis 7.0 writes '-0' and HINCRBY
  -- refuses (Valkey writes 0).
  call('HINCRBY', KEYS[1], 'reserved', 0 - released)
end
call('ZREM', KEYS[3], request_id)

local spend
if actual > 0 then
  spend = call('HINCRBY', KEYS[1], 'spend', actual)
  -- A hold existed, so did the counters, with their TTL (armed at creation, see
  -- budget_reserve.lua); otherwise this call may have created them.
  if ttl_ms > 0 and not amount then call('PEXPIRE', KEYS[1], ttl_ms) end
else
  local spent = call('HGET', KEYS[1], 'spend')
  spend = spent and spent + 0 or 0
end
return {1, released, spend}
