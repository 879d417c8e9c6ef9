-- lease.lua: a lease held by one owner at a time (worker/results.py's emitter).
-- KEYS[K.LEASE]; ARGV (A): op, owner, ttl ms (relative: Redis' clock, whatever the caller's says).
--   hold:    take it if free, renew it if the owner holds it; returns 1 if the owner holds it now
--   release: drop it if the owner holds it; returns 1 if it did
local holder = redis.call('GET', KEYS[K.LEASE])
if ARGV[A.OP] == 'hold' then
  if holder and holder ~= ARGV[A.OWNER] then return 0 end
  redis.call('SET', KEYS[K.LEASE], ARGV[A.OWNER], 'PX', ARGV[A.TTL])
  return 1
end
if holder == ARGV[A.OWNER] then
  redis.call('DEL', KEYS[K.LEASE])
  return 1
end
return 0
