-- ahead.lua: where a member of a sharded board stands in one of its shards (common/store/shardreads.py).
--! read-only (run with EVALSHA_RO: a user whose keys are read-only may run it)
--! include page
-- KEYS (positions in K, ARGV in A): the shard's rank zset, overflow zset, meta hash, seq.
-- ARGV: desc 1|0 (the board's order), reverse 1|0 (view opposite to it), the member's zset
--       score and zset member (its tie prefix included: a packed window has none), the ZCOUNT
--       bounds of the scores strictly better in the view ('' '': no strictly-better count),
--       around (-1: no rows; n: the rows at view positions [ahead - n, ahead + n + 1)), the tie
--       prefix's length.
-- Returns {total, seq, ahead: the shard's members before it in the view (itself excluded),
-- better: those strictly better ( -1 without bounds)}, then with around >= 0 the rows as
-- top.lua returns them with raw 1 (tie prefixes kept, metas by member id).
-- Members of equal score sort by their bytes (memcmp, as Redis orders them): Lua's own string
-- comparison follows the server's locale, so the bytes are compared one by one here.
local desc, reverse = ARGV[A.DESC] == '1', ARGV[A.REVERSE] == '1'
local high_first = desc ~= reverse
local score, member = ARGV[A.SCORE], ARGV[A.MEMBER]
local RK, OV = KEYS[K.RANK], KEYS[K.OVERFLOW]

local function bytes_before(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- entries of one zset before (score, member) in the view
local function ahead_in(key)
  local before
  if high_first then before = redis.call('ZCOUNT', key, '(' .. score, '+inf')
  else before = redis.call('ZCOUNT', key, '-inf', '(' .. score) end
  local equal = redis.call('ZCOUNT', key, score, score)
  if equal == 0 then return before end
  -- the equal scores hold view positions [before, before + equal): the first not ahead of member
  local lo, hi = before, before + equal
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m
    if high_first then m = redis.call('ZREVRANGE', key, mid, mid)[1]
    else m = redis.call('ZRANGE', key, mid, mid)[1] end
    local is_ahead
    if high_first then is_ahead = bytes_before(member, m) else is_ahead = bytes_before(m, member) end
    if is_ahead then lo = mid + 1 else hi = mid end
  end
  return lo
end

local R, O = redis.call('ZCARD', RK), redis.call('ZCARD', OV)
local ahead = ahead_in(RK) + ahead_in(OV)
local better = -1
local lo, hi = ARGV[A.LO], ARGV[A.HI]
if lo ~= '' then better = redis.call('ZCOUNT', RK, lo, hi) + redis.call('ZCOUNT', OV, lo, hi) end
local out = {R + O, tonumber(redis.call('GET', KEYS[K.SEQ]) or '0'), ahead, better}
local around = tonumber(ARGV[A.AROUND])
if around >= 0 then
  local plen = tonumber(ARGV[A.PLEN])
  local members, scores = PAGE.rows(RK, OV, R, O, math.max(ahead - around, 0), ahead + around + 1,
    high_first, reverse, 0)
  PAGE.append(out, members, scores, KEYS[K.META], plen)
end
return out
