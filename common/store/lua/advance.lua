-- advance.lua: raise partitions' "applied up to" records (worker/sources.py), never lower them: a
-- worker that lost its partitions, or `rankstream accept-redis` racing a running worker, must not
-- move a record back below what was applied (the owner would then block as redis_behind).
--
-- KEYS: [1] the group's sources hash. ARGV (common/store/advance.py): topic id (A.TOPIC_ID), then
-- pairs (partition, last offset).
-- A record of another topic id (a recreated topic) is replaced.
local tid = ARGV[A.TOPIC_ID]
for i = A._N + 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  local keep = false
  if cur then
    local t, o = string.match(cur, '^(.*)|(%-?%d+)$')
    keep = t == tid and tonumber(o) >= tonumber(ARGV[i + 1])
  end
  if not keep then redis.call('HSET', KEYS[1], ARGV[i], tid .. '|' .. ARGV[i + 1]) end
end
return 0
