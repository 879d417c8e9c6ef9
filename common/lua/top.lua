-- top.lua: one page of a board window in one round trip.
-- KEYS: [1] rank zset, [2] overflow zset, [3] meta hash, [4] board seq
-- ARGV: [1] start, [2] stop (exclusive; 0-based positions in the view),
--       [3] desc 1|0 (the board's order), [4] reverse 1|0 (view opposite to it), [5] tie prefix length
-- Returns {total, seq, n, member_1, score_1, ..., member_n, score_n, meta_1 ('' if none), ..., meta_n}.
-- The board's order is the rank zset then the overflow zset (max_members); a reversed view
-- reads the overflow first and each set backwards, so it is exactly the natural order reversed.
local start, stop = tonumber(ARGV[1]), tonumber(ARGV[2])
local desc, reverse, plen = ARGV[3] == '1', ARGV[4] == '1', tonumber(ARGV[5])
local R, O = redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])
local high_first = desc ~= reverse
local sets = reverse and {{KEYS[2], O}, {KEYS[1], R}} or {{KEYS[1], R}, {KEYS[2], O}}
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
local out = {R + O, tonumber(redis.call('GET', KEYS[4]) or '0'), #members}
for j = 1, #members do
  out[#out + 1] = members[j]
  out[#out + 1] = scores[j]
end
if #members > 0 then
  local metas = redis.call('HMGET', KEYS[3], unpack(members))
  for j = 1, #members do out[#out + 1] = metas[j] or '' end
end
return out
