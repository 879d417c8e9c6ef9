-- seed_update.lua: the seed design's write path, one call per event (the baseline rankstream
-- is measured against; rankstream itself never runs this).
--
-- KEYS: [1] the msgId dedupe key, [2..] one sorted set per window (total, day, week).
-- ARGV: [1] member, [2] increment, [3] dedupe ttl in seconds.
-- Returns 1 when the event was new and applied, 0 for a duplicate msgId.
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[3]) then
  for i = 2, #KEYS do
    redis.call('ZINCRBY', KEYS[i], ARGV[2], ARGV[1])
  end
  return 1
end
return 0
