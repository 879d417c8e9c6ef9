-- top.lua: one page of a board window in one round trip.
-- KEYS (positions in K, ARGV in A; common/store/reads.py): rank zset, overflow zset, meta hash,
--       board seq. ARGV: start, stop (exclusive; 0-based positions in the view), desc 1|0 (the
--       board's order), reverse 1|0 (view opposite to it), the tie prefix's length
-- Returns {total, seq, n, member_1, score_1, ..., member_n, score_n, meta_1 ('' if none), ..., meta_n}.
-- The board's order is the rank zset then the overflow zset (max_members); a reversed view
-- reads the overflow first and each set backwards, so it is exactly the natural order reversed.
local start, stop = tonumber(ARGV[A.START]), tonumber(ARGV[A.STOP])
local desc, reverse, plen = ARGV[A.DESC] == '1', ARGV[A.REVERSE] == '1', tonumber(ARGV[A.PLEN])
local RK, OV = KEYS[K.RANK], KEYS[K.OVERFLOW]
local R, O = redis.call('ZCARD', RK), redis.call('ZCARD', OV)
local high_first = desc ~= reverse
local sets = reverse and {{OV, O}, {RK, R}} or {{RK, R}, {OV, O}}
local members, scores, offset = {}, {}, 0
for _, s in ipairs(sets) do
  local a, b = math.max(start - offset, 0), math.min(stop - offset, s[2]) - 1
  if a <= b then
    local rows
    if high_first then rows = redis.call('ZREVRANGE', s[1], a, b, 'WITHSCORES')
    else rows = redis.call('ZRANGE', s[1], a, b, 'WITHSCORES') end
    for j = 1, #rows, 2 do
      members[#members + 1] = string.sub(rows[j], plen + 1)
      scores[#scores + 1] = rows[j + 1]
    end
  end
  offset = offset + s[2]
end
local out = {R + O, tonumber(redis.call('GET', KEYS[K.SEQ]) or '0'), #members}
for j = 1, #members do
  out[#out + 1] = members[j]
  out[#out + 1] = scores[j]
end
if #members > 0 then
  local metas = redis.call('HMGET', KEYS[K.META], unpack(members))
  for j = 1, #members do out[#out + 1] = metas[j] or '' end
end
return out
