-- budget_settle_many.lua: settle many requests at one principal's budget (and rate windows)
-- in one call: the work of one budget_settle.lua call per request, in order, with the
-- shared counters read and written once (the merge contract: triogate/batch/_merge.py).
--
-- KEYS     those of budget_settle.lua, the same for every request (distinct keys)
-- ARGV     for each request in order: its argument count, then budget_settle.lua's
--          arguments (4, or 9 + #windows with rate windows; the windows' kinds the same in
--          every request)
-- Returns  an array: each request's budget_settle.lua reply, {applied, released, spend},
--          as if the requests had been settled one after the other; or an error reply,
--          having written nothing, when any request's arguments are refused.
--
-- Equal to the calls in sequence, because:
-- * markers: a request is applied iff its id is neither in the markers HASH nor an earlier
--   request of this call (HMGET, then one HSET of the new ids); the PAD and the HASH's TTL
--   as the first new marker would have them;
-- * rate windows: each applied request's adjustments run in order, budget_settle.lua's
--   rules on a copy of the window's fields (below; keep the rules identical), written
--   back once; parallel slots: one ZREM of every applied id;
-- * holds: one HMGET; what was found is HDEL'd in one call and its sum leaves `reserved`
--   in one HINCRBY; leases: one ZREM;
-- * spend: one HINCRBY of the applied requests' sum; each reply's spend is the total
--   after that request (the final value minus what later requests added); the counters'
--   TTL is armed with the last ttl_ms a lone call would have armed (actual > 0, no hold,
--   ttl_ms > 0); PEXPIREs of one script share its time, so the last one decides;
-- * budget keys and window keys are distinct (checked), so the order between the windows'
--   work and the budget's does not matter.
-- Everything that can raise on stored data (a hold's amount) is read before the first
-- write. Integers only for money, exact up to 2^53, as in budget_settle.lua.

-- Globals are looked up in Redis's protected global table, ~200 instructions each: the
-- ones used often are aliased once (in a fused call KEYS and ARGV are locals already).
local call, KEYS, ARGV = redis.call, KEYS, ARGV

local LIMIT = 9007199254740992
local BUCKET_MS, BUCKETS, WINDOW_TTL_MS = 1000, 60, 120000  -- as in rate_settle.lua
local PAD_FIELD, PAD = '~', '------------------------------------------------------------------------'
-- Integers go to redis.call as Lua numbers where the server prints them exactly and
-- cheaply, else as '%d' strings (see budget_reserve.lua): `NUM and x or fmt('%d', x)`.
local NUM = (redis.VALKEY_VERSION_NUM or 0) >= 0x080100
local fmt = string.format

local n = #KEYS - 4  -- rate windows settled with the budget
-- The refusal's text in two constants joined only when refusing (a `..` on every call
-- made a 150-byte string, hashed and then collected).
local REFUSAL_1, REFUSAL_2 = 'ERR budget_settle_many: expected per request an argument count ',
  'and budget_settle.lua\'s arguments, the same window kinds in each, distinct keys'
if n < 0 then return redis.error_reply(REFUSAL_1 .. REFUSAL_2) end
-- Distinct keys: compared pairwise (interned strings: a pointer compare each), cheaper
-- for a handful of keys than a table of seen keys (a hash insert each).
for i = 2, #KEYS do
  local key = KEYS[i]
  for j = 1, i - 1 do
    if KEYS[j] == key then return redis.error_reply(REFUSAL_1 .. REFUSAL_2) end
  end
end

-- A request is an array, its fields at these indices: built by one constructor (sized
-- once; named fields cost a hash insert each, the most expensive part of a parse).
local ID, ACTUAL, TTL, MARKER_TTL, MODE, BUCKET, ESTIMATE, TOKENS, NOW, AT, APPLIED,
  RELEASED = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12

-- Parse every request (a refusal writes nothing). Integers are converted with `+ 0`
-- (it raises on a non-number: hence the pcall) and checked inline: integral, >= their
-- minimum (1 for the marker TTL, 4 for an argument count, else 0), below 2^53.
local reqs = {}
local ok, good = pcall(function()
  local at, argc, m = 1, #ARGV, 0
  while at <= argc do
    local c = ARGV[at] + 0
    if not (c % 1 == 0 and c >= 4 and c < LIMIT) or at + c > argc then return false end
    local actual, ttl, marker_ttl = ARGV[at + 2] + 0, ARGV[at + 3] + 0, ARGV[at + 4] + 0
    if not (actual % 1 == 0 and actual >= 0 and actual < LIMIT
            and ttl % 1 == 0 and ttl >= 0 and ttl < LIMIT
            and marker_ttl % 1 == 0 and marker_ttl >= 1 and marker_ttl < LIMIT) then
      return false
    end
    local r
    if n > 0 then
      if c ~= 9 + n then return false end
      local mode = ARGV[at + 5]
      local bucket, estimate, tokens, now = ARGV[at + 6] + 0, ARGV[at + 7] + 0,
        ARGV[at + 8] + 0, ARGV[at + 9] + 0
      if not (bucket % 1 == 0 and bucket >= 0 and bucket < LIMIT
              and estimate % 1 == 0 and estimate >= 0 and estimate < LIMIT
              and tokens % 1 == 0 and tokens >= 0 and tokens < LIMIT
              and now % 1 == 0 and now >= 0 and now < LIMIT) then
        return false
      end
      if not (mode == 'a' or mode == 'u' or mode == 'x') then return false end
      for i = 1, n do
        local k = ARGV[at + 9 + i]
        if not (k == 'r' or k == 't' or k == 'p') then return false end
        if m > 0 and k ~= ARGV[reqs[1][AT] + 9 + i] then return false end
      end
      r = {ARGV[at + 1], actual, ttl, marker_ttl, mode, bucket, estimate, tokens, now, at,
        false, 0}
    elseif c ~= 4 then
      return false
    else
      r = {ARGV[at + 1], actual, ttl, marker_ttl, false, false, false, false, false, at,
        false, 0}
    end
    m = m + 1
    reqs[m] = r
    at = at + 1 + c
  end
  return m > 0
end)
if not (ok and good) then return redis.error_reply(REFUSAL_1 .. REFUSAL_2) end
local m = #reqs

-- Reads first: markers, then the holds of the requests to apply.
local ids = {}
for j = 1, m do ids[j] = reqs[j][ID] end
local marks = call('HMGET', KEYS[4], unpack(ids))
local seen, fresh, applied = {}, {}, {}
for j = 1, m do
  local r = reqs[j]
  local id = r[ID]
  if not marks[j] and not seen[id] then
    seen[id] = true
    r[APPLIED] = true
    applied[#applied + 1] = r
    fresh[#fresh + 1] = id
  end
end
local amounts = {}
if #fresh > 0 then
  local held = call('HMGET', KEYS[2], unpack(fresh))
  for k = 1, #fresh do
    if held[k] then amounts[k] = held[k] + 0 else amounts[k] = false end
  end
end

if #fresh > 0 then
  local fields = {}
  for k = 1, #fresh do
    fields[2 * k - 1] = fresh[k]
    fields[2 * k] = '1'
  end
  call('HSET', KEYS[4], unpack(fields))
  if call('HSETNX', KEYS[4], PAD_FIELD, PAD) == 1 then
    call('PEXPIRE', KEYS[4], applied[1][MARKER_TTL])
  end
end

-- The rate windows: budget_settle.lua's adjustments, per applied request in order, on a
-- copy of each window's fields in Lua (read once, with one HMGET of what is missing),
-- written back once at the end: a DEL if the window was deleted on the way, one HSET of
-- what was set, one HDEL of what was removed, the PEXPIRE if a bucket was created after
-- the last DEL. The clamps (a bucket never below 0, a window deleted when its total
-- reaches 0) are applied request by request, exactly as the lone calls do.
if n > 0 and #fresh > 0 then
  local bucket, now_ms, in_window, bucket_s
  local w  -- the window being adjusted: {key, values, deleted, dirty, expire}
  -- A field of the window: from the copy, else (not deleted) read with the others missing.
  local function get3(f1, f2, f3)
    local values = w.values
    local x1, x2, x3 = values[f1], values[f2], values[f3]
    if not w.deleted and (x1 == nil or x2 == nil or x3 == nil) then
      local got = call('HMGET', w.key, f1, f2, f3)
      if x1 == nil then x1 = got[1]; values[f1] = x1 end
      if x2 == nil then x2 = got[2]; values[f2] = x2 end
      if x3 == nil then x3 = got[3]; values[f3] = x3 end
    end
    return x1 or nil, x2 or nil, x3 or nil
  end
  local function set(f, x)
    w.values[f] = x
    w.dirty[f] = true
  end
  local function adjust(delta)
    if delta == 0 or not in_window then return end
    local s1, s2, s3 = get3(bucket_s, 't', 'o')
    local low = s3 and s3 + 0
    if low and bucket < low then return end
    local before = s1 and s1 + 0 or 0
    local value = before + delta
    local total = s2 and s2 + 0
    if value > 0 then
      set(bucket_s, NUM and value or fmt('%d', value))
      if total then
        local t = total + delta
        set('t', NUM and t or fmt('%d', t))
      end
      if not s1 then w.expire = true end
    else
      set(bucket_s, false)
      if total and total - before <= 0 then
        w.values, w.dirty, w.deleted, w.expire = {}, {}, true, false
      elseif total then
        local t = total - before
        set('t', NUM and t or fmt('%d', t))
      end
    end
  end
  local first = reqs[1][AT]
  for i = 1, n do
    local kind, key = ARGV[first + 9 + i], KEYS[4 + i]
    if kind == 'p' then
      call('ZREM', key, unpack(fresh))
    else
      w = {key = key, values = {}, deleted = false, dirty = {}, expire = false}
      for k = 1, #applied do
        local r = applied[k]
        bucket, now_ms = r[BUCKET], r[NOW]
        in_window = bucket > (now_ms - now_ms % BUCKET_MS) / BUCKET_MS - BUCKETS  -- floor
        bucket_s = NUM and bucket or fmt('%d', bucket)
        local mode = r[MODE]
        if mode == 'u' then
          if kind == 'r' then adjust(-1) else adjust(-r[ESTIMATE]) end
        elseif mode == 'a' and kind == 't' then
          adjust(r[TOKENS] - r[ESTIMATE])
        end
      end
      if w.deleted then call('DEL', key) end
      local sets, dels = {}, {}
      for f in pairs(w.dirty) do
        local x = w.values[f]
        if x then
          sets[#sets + 1] = f
          sets[#sets + 1] = x
        else
          dels[#dels + 1] = f
        end
      end
      if #dels > 0 and not w.deleted then call('HDEL', key, unpack(dels)) end
      if #sets > 0 then call('HSET', key, unpack(sets)) end
      if w.expire then call('PEXPIRE', key, WINDOW_TTL_MS) end
    end
  end
end

-- The budget: holds, leases, spend, each once.
local found, released_sum, charged, ttl = {}, 0, 0, nil
for k = 1, #applied do
  local r, amount = applied[k], amounts[k]
  r[RELEASED] = amount or 0
  if amount then
    found[#found + 1] = r[ID]
    released_sum = released_sum + amount
  end
  local actual = r[ACTUAL]
  charged = charged + actual
  if actual > 0 and r[TTL] > 0 and not amount then ttl = r[TTL] end
end
if #found > 0 then
  call('HDEL', KEYS[2], unpack(found))
  call('HINCRBY', KEYS[1], 'reserved', 0 - released_sum)  -- not -x: see budget_settle.lua
end
if #fresh > 0 then call('ZREM', KEYS[3], unpack(fresh)) end
local spend
if charged > 0 then
  spend = call('HINCRBY', KEYS[1], 'spend', charged)
  if ttl then call('PEXPIRE', KEYS[1], ttl) end
else
  local spent = call('HGET', KEYS[1], 'spend')
  spend = spent and spent + 0 or 0
end

-- Replies, last to first: a request sees the spend after itself.
local out = {}
for j = m, 1, -1 do
  local r = reqs[j]
  if r[APPLIED] then
    out[j] = {1, r[RELEASED], spend}
    spend = spend - r[ACTUAL]
  else
    out[j] = {0, 0, spend}
  end
end
return out
