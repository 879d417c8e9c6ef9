-- overflow.lua: max_members (included by apply.lua and guarded.lua). A window instance of a
-- board type with max_members keeps exactly its best max_members members in its rank zset and
-- the rest in its overflow zset.
local OV = {SLICE = 1000}

-- move zset rows (member, score, ...) from one zset to the other
function OV.move(from, to, rows)
  if #rows == 0 then return end
  local add, rem = {}, {}
  for j = 1, #rows, 2 do
    add[#add + 1] = rows[j + 1]
    add[#add + 1] = rows[j]
    rem[#rem + 1] = rows[j]
  end
  redis.call('ZREM', from, unpack(rem))
  redis.call('ZADD', to, unpack(add))
end

-- the k best (or worst) members of a zset in the board's order (`desc`), with their scores
function OV.edge(key, k, best, desc)
  if best == desc then return redis.call('ZRANGE', key, -k, -1, 'WITHSCORES') end
  return redis.call('ZRANGE', key, 0, k - 1, 'WITHSCORES')
end

-- keep the rank zset exactly the best maxm members, the rest in the overflow zset. `changed`
-- members were just rewritten: the best `changed` of the overflow are the only ones that can
-- belong in the rank zset now, so they move up, then whatever is beyond maxm moves down (in
-- slices: Lua's unpack takes at most ~8000 values, and a max_members just lowered on a board
-- that already holds many members leaves a large excess)
function OV.rebalance(rk, ov, changed, maxm, desc)
  local up = math.min(changed, redis.call('ZCARD', ov))
  while up > 0 do
    local k = math.min(up, OV.SLICE)
    OV.move(ov, rk, OV.edge(ov, k, true, desc))
    up = up - k
  end
  local down = redis.call('ZCARD', rk) - maxm
  while down > 0 do
    local k = math.min(down, OV.SLICE)
    OV.move(rk, ov, OV.edge(rk, k, false, desc))
    down = down - k
  end
end
