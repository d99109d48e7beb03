-- identity_store.lua: write back identity rows read from SQL, unless an admin change
-- happened since they were read (the generation moved), which would make them stale.
-- KEYS[1]      the identity generation counter (tg:{id}:gen)
-- KEYS[2..n]   identity rows to set (tag {id})
-- ARGV[1]      the generation seen before the SQL read ('' when the counter was unset)
-- ARGV[2]      TTL of the rows (ms, integer)
-- ARGV[3..]    the rows' JSON, in KEYS[2..n] order
-- returns      the number of rows written (0 when the generation moved)
-- Time: none. Money: none.
local seen = ARGV[1]
local current = redis.call('GET', KEYS[1]) or ''
if current ~= seen then
  return 0
end
local ttl = tonumber(ARGV[2])
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 1], 'PX', ttl)
end
return #KEYS - 1
