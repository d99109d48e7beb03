-- wrk_chat.lua: POST an OpenAI chat completion per request, with a prompt of its own.
--
-- Driven by environment variables (load.py sets them):
--   WRK_AUTH     value of the Authorization header ("Bearer sk-...")
--   WRK_MODEL    the "model" field
--   WRK_STREAM   "1": ask for an SSE stream (wrk reads it to the last chunk)
--   WRK_FIXED    "1": the same prompt every time (response-cache hits); else every
--                request's prompt is unique (run id, thread, counter): a cache miss
--   WRK_RUN      a run id, so that no two runs share a prompt
--   WRK_USER     the "user" field (the end user whose budget is checked); empty: none
--   WRK_OUT      file the summary JSON is written to (latencies in microseconds)
--
-- The path comes from the URL given to wrk.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

local counter = 0
local prefix, head, tail, headers

function init(args)
  local stream = os.getenv("WRK_STREAM") == "1"
  prefix = (os.getenv("WRK_RUN") or "run") .. "-" .. tostring(tid)
  if os.getenv("WRK_FIXED") == "1" then
    prefix = "fixed"
  end
  head = '{"model":"' .. os.getenv("WRK_MODEL") .. '","max_tokens":16,'
  local user = os.getenv("WRK_USER") or ""
  if user ~= "" then
    head = head .. '"user":"' .. user .. '",'
  end
  if stream then
    head = head .. '"stream":true,"stream_options":{"include_usage":true},'
  end
  head = head .. '"messages":[{"role":"user","content":"'
  tail = '"}]}'
  headers = {
    ["Content-Type"] = "application/json",
    ["Authorization"] = os.getenv("WRK_AUTH"),
  }
end

function request()
  local prompt
  if prefix == "fixed" then
    prompt = "a benchmark question asked again and again"
  else
    counter = counter + 1
    prompt = "benchmark " .. prefix .. " request " .. counter .. " please answer briefly"
  end
  return wrk.format("POST", nil, headers, head .. prompt .. tail)
end

function done(summary, latency, requests)
  local out = io.open(os.getenv("WRK_OUT"), "w")
  local e = summary.errors
  out:write(string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
  out:close()
end
