-- routing_record.lua: after the model call, record one request's attempts on one model
-- group's deployments, idempotently by request id, and release its least-busy claim.
--
-- Declared on the request's post-call batch (triogate/routing/router.py), one call per
-- group touched. The settler may replay it after an outage: the marker key (SET NX PX,
-- checked here, in the same hash tag {rt:<group>}) makes a replay count nothing twice.
--
-- KEYS[1]      marker         tg:{rt:g}:rec:<request id>
-- KEYS[2]      usage hash of the minute of now_ms   tg:{rt:g}:usage:<minute>
--              fields rpm:<id>, tpm:<id>, fail:<id> (integers)
-- KEYS[3]      cooldown hash  tg:{rt:g}:cooldown   field <id> -> until (epoch ms)
-- KEYS[4]      latency hash   tg:{rt:g}:latency    field <id> -> EWMA (ms, decimal)
-- KEYS[5..]    in-flight ZSETs to remove this request's claim from (ZREM; may be none)
--
-- ARGV[1]      now_ms: epoch ms. Time comes from ARGV, never from TIME.
-- ARGV[2]      request id
-- ARGV[3]      marker_ttl_ms
-- ARGV[4]      usage_ttl_ms: lifetime of the minute's usage hash from its first record
-- ARGV[5]      allowed_fails: failures in one minute that start a cooldown (>= 1)
-- ARGV[6]      cooldown_ms: length of a cooldown (0 = never cool down)
-- ARGV[7]      latency_alpha: EWMA weight of a new sample (0 < alpha <= 1)
-- ARGV[8]      latency_ttl_ms: lifetime of the latency hash from the first update of a
--              minute (so at least latency_ttl_ms - 60 s after its last update)
-- ARGV[9+4(k-1) .. 12+4(k-1)]  attempt k: deployment id, outcome ("ok" | "fail"),
--              tokens (integer; counted on "ok"), latency_ms (decimal; "ok" only)
--
-- On "ok": rpm:<id> += 1, tpm:<id> += tokens, latency EWMA updated.
-- On "fail": fail:<id> += 1; when it reaches allowed_fails, the deployment cools down
-- until max(current until, now + cooldown_ms).
-- The claim release (ZREM) happens on replays too: it is idempotent by itself.
--
-- Returns: { applied (1 = counted now, 0 = already applied: a replay),
--            ids of deployments that entered a cooldown ... }
-- Integers only for counters; no money here.

local now = tonumber(ARGV[1])
local request_id = ARGV[2]

for i = 5, #KEYS do
  redis.call('ZREM', KEYS[i], request_id)
end

if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[3]) then
  return { 0 }
end

local usage_ttl_ms = tonumber(ARGV[4])
local allowed_fails = tonumber(ARGV[5])
local cooldown_ms = tonumber(ARGV[6])
local alpha = tonumber(ARGV[7])
local latency_ttl_ms = tonumber(ARGV[8])
if allowed_fails < 1 then allowed_fails = 1 end

local out = { 1 }
local cooldown_until = 0

-- Read every field this record changes with one HMGET per hash, then write each hash with
-- one HSET: exact, since the script runs atomically. The usage hash also keeps two flags,
-- `ttl:usage` and `ttl:latency` (no deployment field starts with `ttl:`): each says that
-- this minute's record already armed that TTL, so each is armed once a minute, not on
-- every record.
local usage_fields, usage_index = { 'ttl:usage', 'ttl:latency' }, {}
local latency_ids, latency_index = {}, {}
local function want(list, index, name)
  if not index[name] then
    list[#list + 1] = name
    index[name] = #list
  end
end
for base = 9, #ARGV, 4 do
  local id = ARGV[base]
  local outcome = ARGV[base + 1]
  if outcome == 'ok' then
    want(usage_fields, usage_index, 'rpm:' .. id)
    want(usage_fields, usage_index, 'tpm:' .. id)
    want(latency_ids, latency_index, id)
  elseif outcome == 'fail' then
    want(usage_fields, usage_index, 'fail:' .. id)
  end
end
if #usage_fields == 2 then return out end  -- no attempt to count

local read = redis.call('HMGET', KEYS[2], unpack(usage_fields))
local usage = {}
for j = 3, #usage_fields do usage[usage_fields[j]] = tonumber(read[j]) or 0 end
local latency = {}
if #latency_ids > 0 then
  local old = redis.call('HMGET', KEYS[4], unpack(latency_ids))
  for j = 1, #latency_ids do latency[latency_ids[j]] = tonumber(old[j]) end
end

for base = 9, #ARGV, 4 do
  local id = ARGV[base]
  local outcome = ARGV[base + 1]
  if outcome == 'ok' then
    usage['rpm:' .. id] = usage['rpm:' .. id] + 1
    usage['tpm:' .. id] = usage['tpm:' .. id] + tonumber(ARGV[base + 2])
    local sample = tonumber(ARGV[base + 3])
    local before = latency[id]
    if before then latency[id] = alpha * sample + (1 - alpha) * before else latency[id] = sample end
  elseif outcome == 'fail' then
    local fails = usage['fail:' .. id] + 1
    usage['fail:' .. id] = fails
    if fails >= allowed_fails and cooldown_ms > 0 then
      local until_ms = now + cooldown_ms
      local current = tonumber(redis.call('HGET', KEYS[3], id) or '0')
      if current > until_ms then until_ms = current end
      redis.call('HSET', KEYS[3], id, string.format('%d', until_ms))
      if until_ms > cooldown_until then cooldown_until = until_ms end
      out[#out + 1] = id
    end
  end
end

local writes = {}
for j = 3, #usage_fields do
  writes[#writes + 1] = usage_fields[j]
  writes[#writes + 1] = string.format('%d', usage[usage_fields[j]])
end
local arm_usage = not read[1]
local arm_latency = #latency_ids > 0 and not read[2]
if arm_usage then
  writes[#writes + 1] = 'ttl:usage'
  writes[#writes + 1] = '1'
end
if arm_latency then
  writes[#writes + 1] = 'ttl:latency'
  writes[#writes + 1] = '1'
end
redis.call('HSET', KEYS[2], unpack(writes))
if arm_usage then redis.call('PEXPIRE', KEYS[2], usage_ttl_ms) end
if #latency_ids > 0 then
  local fields = {}
  for _, id in ipairs(latency_ids) do
    fields[#fields + 1] = id
    fields[#fields + 1] = string.format('%.3f', latency[id])
  end
  redis.call('HSET', KEYS[4], unpack(fields))
  if arm_latency then redis.call('PEXPIRE', KEYS[4], latency_ttl_ms) end
end
if cooldown_until > 0 then
  -- The hash lives as long as its latest deadline (plus a margin); expired fields are
  -- ignored by readers, so they need no cleanup.
  local keep_ms = cooldown_until - now + 60000
  if redis.call('PTTL', KEYS[3]) < keep_ms then
    redis.call('PEXPIRE', KEYS[3], keep_ms)
  end
end
return out
