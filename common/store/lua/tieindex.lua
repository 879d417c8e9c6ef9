-- tieindex.lua: the general layout's tie index (included by apply.lua, locate.lua and
-- statepage.lua, after xhash.lua).
--
-- A general window instance keeps each member in its zsets under the member's id prefixed
-- with its tie (encoding.lua ENC.member), scored with its exact score. The tie index says, per
-- member, the ms its tie counts from, so the zset entry (and with it the score) can be found:
-- xhash.lua's buckets under <dir> = the instance's :t: key (zset member id -> tie ms; a
-- member's slot value is XH.string_slot of its id). Small buckets are listpacks: an entry costs
-- about its id and ~10 bytes, where a hash field costs ~60 more (common/store/keys.py).
-- A period's index keys expire with it (`expire_at`, '0' = never).

local TI = {}

function TI.new(dir, cap, expire_at)
  local function expire(key)
    if expire_at ~= '0' then redis.call('PEXPIREAT', key, expire_at) end
  end
  return {x = XH.new(dir, cap, XH.string_slot, expire), slots = {}}
end

local function slot_of(t)
  return function(member)
    local v = t.slots[member]
    if v == nil then
      v = XH.string_slot(member)
      t.slots[member] = v
    end
    return v
  end
end

-- the tie of each of `members` (false: not in the index), one ZMSCORE per bucket
function TI.ties(t, members)
  local out = {}
  local keys, groups = XH.group(t.x, members, slot_of(t))
  for _, key in ipairs(keys) do
    local g = groups[key].items
    local got = redis.call('ZMSCORE', key, unpack(g))
    for j, member in ipairs(g) do out[member] = got[j] and tonumber(got[j]) or false end
  end
  return out
end

-- the tie of one member, or nil
function TI.tie(t, member)
  local got = redis.call('ZSCORE', (XH.bucket(t.x, slot_of(t)(member))), member)
  return got and tonumber(got)
end

-- write members' ties: `put` = {member, tie} pairs, `drop` = members leaving the instance.
-- Per bucket one ZREM and one ZADD; a bucket that may have been created now (it holds no more
-- entries than were just put) gets the instance's expiry, and one that outgrew the cap splits.
function TI.write(t, put, drop)
  local items = {}
  for _, pair in ipairs(put) do items[#items + 1] = pair end
  for _, member in ipairs(drop) do items[#items + 1] = {member} end
  local slot = slot_of(t)
  local keys, groups = XH.group(t.x, items, function(item) return slot(item[1]) end)
  for _, key in ipairs(keys) do
    local g, rem, add = groups[key], {}, {}
    for _, item in ipairs(g.items) do
      if item[2] then
        add[#add + 1] = ENC.score(item[2])
        add[#add + 1] = item[1]
      else
        rem[#rem + 1] = item[1]
      end
    end
    if #rem > 0 then redis.call('ZREM', key, unpack(rem)) end
    if #add > 0 then
      redis.call('ZADD', key, unpack(add))
      local card = XH.settle(t.x, key, g.d, g.p)
      if card >= 0 and card <= #add / 2 then t.x.expire(key) end
    end
  end
end

-- one page of the index for backfill from `cursor` (0 to start; XH.next_cursor): {member, tie}
-- pairs of whole buckets, at least `size` unless the walk ends, and the next cursor (-1: done)
function TI.page(t, cursor, size)
  local rows = {}
  while cursor >= 0 and #rows < size do
    local key, d, p = XH.bucket(t.x, cursor)
    local got = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    for j = 1, #got, 2 do rows[#rows + 1] = {got[j], tonumber(got[j + 1])} end
    cursor = XH.next_cursor(p, d)
  end
  return rows, cursor
end
