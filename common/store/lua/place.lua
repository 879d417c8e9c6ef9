-- place.lua: seats in a league season (common/league.py), given out once per member, each in
-- the tier their latest season's final standing earns them.
--! include encoding
-- KEYS (K): the season's seats hash (member -> "<tier>:<order>"), its seats taken per tier
--   (tier -> count), the season's marker, the board's never-written `moving` key (a migrating
--   slot refuses the call).
-- ARGV (A): the season's expiry ms (0 = never), the entry tier, the division size, the board's
--   key stem (`<prefix>{<board>}:`, common/store/keys.py: the names below are its names), the
--   season's instance (`season:<id>`), the tie mode (inv|fwd) and desc 1|0 of the board, how
--   many tiers follow, how many earlier seasons follow, then per tier (lowest first) its name
--   and its promotion and demotion ('c' count | 'f' fraction | '' none, and the number), then
--   per earlier season still kept (newest first) its instance and expiry, then the members in
--   the order they joined.
-- A sealed season seats no one (its standings are final): '' for each member. Otherwise the
-- season before it is sealed first (a season is final once the next one seats a member), a
-- member with a seat keeps it, and any other takes the next seat of the tier their latest kept
-- season ended them in (promoted, demoted or kept by its rules; none: the entry tier).
-- Returns each member's seat ('' = none), in order.
local stem = ARGV[A.STEM]
local size, desc, mode = tonumber(ARGV[A.SIZE]), ARGV[A.DESC] == '1', ARGV[A.MODE]
local function seats_of(season) return stem .. 'lg:' .. season .. ':s' end
local function marker_of(season) return stem .. 'rp:' .. season end
local sealed_mark = function(mark) return mark and string.byte(mark, 1) == 115 end  -- 's': sealed, sending, sent

local out = {}
local n, kept = tonumber(ARGV[A.TIERS]), tonumber(ARGV[A.KEPT])
local earlier = A.KEPT + 5 * n  -- the earlier seasons' fields start after it
local first = earlier + 2 * kept + 1
if sealed_mark(redis.call('GET', KEYS[K.MARK])) then
  for i = first, #ARGV do out[#out + 1] = '' end
  return out
end

local tiers, index, up, down = {}, {}, {}, {}
for t = 1, n do
  local at = A.KEPT + 5 * (t - 1)
  tiers[t] = ARGV[at + 1]
  index[tiers[t]] = t
  up[t] = {ARGV[at + 2], tonumber(ARGV[at + 3])}
  down[t] = {ARGV[at + 4], tonumber(ARGV[at + 5])}
end

-- how many of a division of `members` a rule moves (a fraction rounds down)
local function moved(rule, members)
  if rule[1] == 'c' then return math.min(rule[2], members) end
  if rule[1] == 'f' then return math.floor(rule[2] * members) end
  return 0
end

-- a season is final from now on (periodmark.lua's seal): apply.lua and the worker's writes
-- leave its divisions alone
local function seal(season, expire)
  local marker = marker_of(season)
  local mark = redis.call('GET', marker)
  if sealed_mark(mark) then return end
  if expire and expire > 0 then redis.call('SET', marker, 'sealed', 'PXAT', expire)
  else redis.call('SET', marker, 'sealed') end
end

-- the tier a member seated `order`-th in `tier` ends `season` in: promoted, demoted or kept by
-- their rank in their division (a member without a score there keeps their tier)
local function outcome(season, tier, order, member)
  local t = index[tier]
  if not t then return nil end
  local division = stem .. 'z:' .. season .. '@' .. tier .. '.' .. (math.floor(order / size) + 1)
  local r = redis.call(desc and 'ZREVRANK' or 'ZRANK', division, ENC.member(mode, order, member))
  if not r then return tier end
  local members, rank = redis.call('ZCARD', division), r + 1
  if t < n and rank <= moved(up[t], members) then return tiers[t + 1] end
  if t > 1 and rank > members - moved(down[t], members) then return tiers[t - 1] end
  return tier
end

-- the earlier seasons that seated anyone (one EXISTS each, not one HGET each per newcomer)
local seasons, expiries = {}, {}
for k = 1, kept do
  local season = ARGV[earlier + 2 * k - 1]
  if redis.call('EXISTS', seats_of(season)) == 1 then
    seasons[#seasons + 1], expiries[#expiries + 1] = season, tonumber(ARGV[earlier + 2 * k])
  end
end
if kept > 0 then seal(ARGV[earlier + 1], tonumber(ARGV[earlier + 2])) end
local seats, taken = KEYS[K.SEATS], KEYS[K.TAKEN]
local counts = {}  -- tier -> seats taken, read once and written once per call
local placed = false
for i = first, #ARGV do
  local member = ARGV[i]
  local seat = redis.call('HGET', seats, member)
  if not seat then
    local tier = ARGV[A.ENTRY]
    for k = 1, #seasons do  -- the member's latest season still kept: how it ended for them
      local held = redis.call('HGET', seats_of(seasons[k]), member)
      if held then
        seal(seasons[k], expiries[k])
        local t, o = string.match(held, '^(.*):(%d+)$')
        tier = outcome(seasons[k], t, tonumber(o), member) or ARGV[A.ENTRY]  -- (a tier no longer configured)
        break
      end
    end
    local order = counts[tier] or tonumber(redis.call('HGET', taken, tier) or '0')
    counts[tier] = order + 1
    seat = tier .. ':' .. order
    redis.call('HSET', seats, member, seat)
    placed = true
  end
  out[#out + 1] = seat
end
for tier, count in pairs(counts) do redis.call('HSET', taken, tier, count) end
if placed and ARGV[A.EXPIRE] ~= '0' then
  redis.call('PEXPIREAT', seats, ARGV[A.EXPIRE])
  redis.call('PEXPIREAT', taken, ARGV[A.EXPIRE])
end
return out
