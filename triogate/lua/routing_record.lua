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
-- ARGV[4]      usage_ttl_ms: lifetime of the minute's usage hash
-- ARGV[5]      allowed_fails: failures in one minute that start a cooldown (>= 1)
-- ARGV[6]      cooldown_ms: length of a cooldown (0 = never cool down)
-- ARGV[7]      latency_alpha: EWMA weight of a new sample (0 < alpha <= 1)
-- ARGV[8]      latency_ttl_ms: lifetime of the latency hash after its last update
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

-- `+ 0` converts once where tonumber converts twice (Lua 5.1: lua_isnumber, lua_tonumber).
local now = ARGV[1] + 0
local request_id = ARGV[2]

for i = 5, #KEYS do
  redis.call('ZREM', KEYS[i], request_id)
end

if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[3]) then
  return { 0 }
end

local usage_ttl_ms = ARGV[4] + 0
local allowed_fails = ARGV[5] + 0
local cooldown_ms = ARGV[6] + 0
local alpha = ARGV[7] + 0
local latency_ttl_ms = ARGV[8] + 0
if allowed_fails < 1 then allowed_fails = 1 end

local out = { 1 }
local touched_usage = false
local touched_latency = false
local cooldown_until = 0

for base = 9, #ARGV, 4 do
  local id = ARGV[base]
  local outcome = ARGV[base + 1]
  if outcome == 'ok' then
    redis.call('HINCRBY', KEYS[2], 'rpm:' .. id, 1)
    redis.call('HINCRBY', KEYS[2], 'tpm:' .. id, ARGV[base + 2])
    local sample = ARGV[base + 3] + 0
    local old = redis.call('HGET', KEYS[4], id)
    local ewma = sample
    if old then ewma = alpha * sample + (1 - alpha) * (old + 0) end
    redis.call('HSET', KEYS[4], id, string.format('%.3f', ewma))
    touched_usage = true
    touched_latency = true
  elseif outcome == 'fail' then
    local fails = redis.call('HINCRBY', KEYS[2], 'fail:' .. id, 1)
    touched_usage = true
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

if touched_usage then
  redis.call('PEXPIRE', KEYS[2], usage_ttl_ms)
end
if touched_latency then
  redis.call('PEXPIRE', KEYS[4], latency_ttl_ms)
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
