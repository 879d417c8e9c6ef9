-- page.lua: a window's rows by position in the view (included by top.lua and locate.lua).
-- The board's order is the rank zset then the overflow zset (max_members); a reversed view
-- reads the overflow first and each set backwards, so it is exactly the natural order reversed.
local PAGE = {}

-- positions [start, stop) of the view (0-based): members (tie prefix of `plen` bytes cut off)
-- and their zset scores; R, O: the sets' sizes
function PAGE.rows(RK, OV, R, O, start, stop, high_first, reverse, plen)
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
  return members, scores
end

-- appends n, member_1, score_1, ..., member_n, score_n, meta_1 ('' if none), ..., meta_n to out;
-- `plen` (default 0): members still carry a tie prefix of that many bytes (metas are by member id)
function PAGE.append(out, members, scores, meta_key, plen)
  out[#out + 1] = #members
  for j = 1, #members do
    out[#out + 1] = members[j]
    out[#out + 1] = scores[j]
  end
  if #members > 0 then
    local ids = members
    if plen and plen > 0 then
      ids = {}
      for j = 1, #members do ids[j] = string.sub(members[j], plen + 1) end
    end
    local metas = redis.call('HMGET', meta_key, unpack(ids))
    for j = 1, #members do out[#out + 1] = metas[j] or '' end
  end
end
