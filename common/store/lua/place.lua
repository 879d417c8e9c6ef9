-- place.lua: seats in a league season (common/league.py), given out once per member.
-- KEYS (K): the season's seats hash (member -> "<tier>:<order>"), its seats taken per tier
--   (tier -> count), the members' carried tiers (member -> tier).
-- ARGV (A): the season's expiry ms (0 = never), the entry tier, how many tiers follow, the
--   tiers, then the members in the order they joined.
-- A member with a seat keeps it; any other takes the next seat of their carried tier (the entry
-- tier if none, or if it is no longer a tier). Returns each member's seat, in order.
local seats, taken, carried = KEYS[K.SEATS], KEYS[K.TAKEN], KEYS[K.CARRIED]
local n = tonumber(ARGV[A.TIERS])
local known = {}
for t = 1, n do known[ARGV[A.TIERS + t]] = true end
local out, placed = {}, false
for i = A.TIERS + n + 1, #ARGV do
  local member = ARGV[i]
  local seat = redis.call('HGET', seats, member)
  if not seat then
    local tier = redis.call('HGET', carried, member)
    if not tier or not known[tier] then tier = ARGV[A.ENTRY] end
    local order = tonumber(redis.call('HGET', taken, tier) or '0')
    redis.call('HSET', taken, tier, order + 1)
    seat = tier .. ':' .. order
    redis.call('HSET', seats, member, seat)
    placed = true
  end
  out[#out + 1] = seat
end
if placed and ARGV[A.EXPIRE] ~= '0' then
  redis.call('PEXPIREAT', seats, ARGV[A.EXPIRE])
  redis.call('PEXPIREAT', taken, ARGV[A.EXPIRE])
end
return out
