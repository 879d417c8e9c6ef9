-- standing.lua: a league member's standing in their division, in one call: the division's top,
-- the member's position, and the rows around it, as of one seq (api/league.py).
--! read-only (run with EVALSHA_RO: a user whose keys are read-only may run it)
--! include page
-- KEYS (K): the division's rank zset, the board's meta hash, the board's seq.
-- ARGV (A): the member's entry (their id under their join order: a division keeps no tie index),
--   n (rows above and below), limit (the top's rows), desc 1|0 (the board's order), reverse 1|0
--   (the view opposite to it), the tie prefix's length.
-- Returns {members, seq, position (0-based in the view; -1: not in the division), score ('' if
--   absent), start (the around page's first position), then the top as page.lua appends a page,
--   then the around page likewise}.
local RK = KEYS[K.RANK]
local desc, reverse, plen = ARGV[A.DESC] == '1', ARGV[A.REVERSE] == '1', tonumber(ARGV[A.PLEN])
local n, limit = tonumber(ARGV[A.AROUND]), tonumber(ARGV[A.LIMIT])
local high_first = desc ~= reverse
local R = redis.call('ZCARD', RK)
local out = {R, tonumber(redis.call('GET', KEYS[K.SEQ]) or '0')}
local position = redis.call(high_first and 'ZREVRANK' or 'ZRANK', RK, ARGV[A.ENTRY])
local score = position and redis.call('ZSCORE', RK, ARGV[A.ENTRY]) or ''
local start = position and math.max(position - n, 0) or 0
out[#out + 1] = position or -1
out[#out + 1] = score
out[#out + 1] = start
local members, scores = PAGE.rows(RK, RK, R, 0, 0, limit, high_first, reverse, plen)
PAGE.append(out, members, scores, KEYS[K.META])
if position then
  members, scores = PAGE.rows(RK, RK, R, 0, start, position + n + 1, high_first, reverse, plen)
else
  members, scores = {}, {}
end
PAGE.append(out, members, scores, KEYS[K.META])
return out
