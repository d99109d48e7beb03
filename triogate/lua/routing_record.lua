-- routing_record.lua: after the model call, record one request's attempts on one model
-- group's deployments, idempotently by request id, and release its least-busy claim.
--
-- Declared on the request's post-call batch (triogate/routing/router.py), one call per
-- group touched. The settler may replay it after an outage: the request's marker (a field
-- of the group's markers HASH of the minute the record was declared in, HSETNX here, in
-- the same hash tag {rt:<group>}) makes a replay count nothing twice. A replay carries the
-- same keys, so it finds its marker in the same HASH.
--
-- KEYS[1]      markers HASH   tg:{rt:g}:recs:<minute>   field <request id> -> 1, and the
--              PAD field (below). Versions before this one wrote one STRING per request,
--              tg:{rt:g}:rec:<request id>: another name, so old and new never misread each
--              other; a journal replays a record with the keys it was declared with.
-- KEYS[2]      usage hash of the minute of now_ms   tg:{rt:g}:usage:<minute>
--              fields rpm:<id>, tpm:<id>, fail:<id> (integers)
-- KEYS[3]      cooldown hash  tg:{rt:g}:cooldown   field <id> -> until (epoch ms)
-- KEYS[4]      latency hash   tg:{rt:g}:latency    field <id> -> EWMA (ms, decimal)
-- KEYS[5..]    in-flight ZSETs to remove this request's claim from (ZREM; may be none)
--
-- ARGV[1]      now_ms: epoch ms. Time comes from ARGV, never from TIME.
-- ARGV[2]      request id
-- ARGV[3]      markers_ttl_ms: how long the markers HASH lives from its first field (the
--              caller adds a minute, so every marker lives at least its replay window)
-- ARGV[4]      usage_ttl_ms: lifetime of the minute's usage hash from its creation
-- ARGV[5]      allowed_fails: failures in one minute that start a cooldown (>= 1)
-- ARGV[6]      cooldown_ms: length of a cooldown (0 = never cool down)
-- ARGV[7]      latency_alpha: EWMA weight of a new sample (0 < alpha <= 1)
-- ARGV[8]      latency_ttl_ms: lifetime of the latency hash after its last update, to
--              within a minute: armed when a deployment's first success of a minute is
--              recorded, or when its field (so perhaps the hash) is created
-- ARGV[9+4(k-1) .. 12+4(k-1)]  attempt k: deployment id, outcome ("ok" | "fail"),
--              tokens (integer; counted on "ok"), latency_ms (decimal; "ok" only)
--
-- On "ok": rpm:<id> += 1, tpm:<id> += tokens, latency EWMA updated.
-- On "fail": fail:<id> += 1; when it reaches allowed_fails, the deployment cools down
-- until max(current until, now + cooldown_ms).
-- The claim release (ZREM) happens on replays too: it is idempotent by itself.
-- TTLs are armed only by a write that may have created the key (an HINCRBY answering 1,
-- a latency field that was absent), not by every record: every key still has one.
--
-- Returns: { applied (1 = counted now, 0 = already applied: a replay),
--            ids of deployments that entered a cooldown ... }
-- Integers only for counters; no money here.

-- Globals are looked up in Redis's protected global table, ~200 instructions each: the
-- ones used often are aliased once (in a fused call KEYS and ARGV are locals already).
local call, KEYS, ARGV = redis.call, KEYS, ARGV

-- `+ 0` converts once where tonumber converts twice (Lua 5.1: lua_isnumber, lua_tonumber).
local now = ARGV[1] + 0
local PAD = '------------------------------------------------------------------------'
local request_id = ARGV[2]

for i = 5, #KEYS do
  call('ZREM', KEYS[i], request_id)
end

if call('HSETNX', KEYS[1], request_id, '1') == 0 then
  return { 0 }
end
-- The PAD field: HSETNX says whether the HASH is new (then its TTL is armed) and its long
-- value keeps the HASH a hashtable (a listpack's HSETNX scans every field).
if call('HSETNX', KEYS[1], '~', PAD) == 1 then
  call('PEXPIRE', KEYS[1], ARGV[3])
end

local usage_ttl_ms = ARGV[4] + 0
local allowed_fails = ARGV[5] + 0
local cooldown_ms = ARGV[6] + 0
local alpha = ARGV[7] + 0
local latency_ttl_ms = ARGV[8] + 0
if allowed_fails < 1 then allowed_fails = 1 end

local out = { 1 }
local arm_usage = false
local arm_latency = false
local cooldown_until = 0

for base = 9, #ARGV, 4 do
  local id = ARGV[base]
  local outcome = ARGV[base + 1]
  if outcome == 'ok' then
    local first = call('HINCRBY', KEYS[2], 'rpm:' .. id, 1) == 1
    call('HINCRBY', KEYS[2], 'tpm:' .. id, ARGV[base + 2])
    local sample = ARGV[base + 3] + 0
    local old = call('HGET', KEYS[4], id)
    local ewma = sample
    if old then ewma = alpha * sample + (1 - alpha) * (old + 0) end
    call('HSET', KEYS[4], id, string.format('%.3f', ewma))
    if first then arm_usage = true end
    if first or not old then arm_latency = true end
  elseif outcome == 'fail' then
    local fails = call('HINCRBY', KEYS[2], 'fail:' .. id, 1)
    if fails == 1 then arm_usage = true end
    if fails >= allowed_fails and cooldown_ms > 0 then
      local until_ms = now + cooldown_ms
      local current = tonumber(call('HGET', KEYS[3], id) or '0')
      if current > until_ms then until_ms = current end
      call('HSET', KEYS[3], id, string.format('%d', until_ms))
      if until_ms > cooldown_until then cooldown_until = until_ms end
      out[#out + 1] = id
    end
  end
end

if arm_usage then
  call('PEXPIRE', KEYS[2], usage_ttl_ms)
end
if arm_latency then
  call('PEXPIRE', KEYS[4], latency_ttl_ms)
end
if cooldown_until > 0 then
  -- The hash lives as long as its latest deadline (plus a margin); expired fields are
  -- ignored by readers, so they need no cleanup.
  local keep_ms = cooldown_until - now + 60000
  if call('PTTL', KEYS[3]) < keep_ms then
    call('PEXPIRE', KEYS[3], keep_ms)
  end
end
return out
