-- tieindex.lua: the general layout's tie index (included by apply.lua, locate.lua and
-- statepage.lua, after xhash.lua).
--
-- A general window instance keeps each member in its zsets under the member's id prefixed
-- with its tie (encoding.lua ENC.member), scored with its exact score. The tie index says, per
-- member, the ms its tie counts from, so the zset entry (and with it the score) can be found:
-- xhash.lua's buckets under <dir> = the instance's :t: key (hash member id -> tie ms; a
-- member's slot value is XH.string_slot of its id). Small buckets are listpacks: an entry costs
-- about its id and ~10 bytes, where a field of one big hash costs ~60 more. Hashes, not zsets:
-- a listpack hash sets a field in place, where a zset re-sorts it (~1.8 against ~3 us).
-- A period's index keys expire with it (`expire_at`, '0' = never), spread over a minute after.

local TI = {}

function TI.new(dir, cap, expire_at)
  -- each key up to C.INDEX_SPREAD ms after its period (common/store/keys.py index_expiry): a
  -- big period's thousands of index keys expiring at once would block Redis' expire cycle
  local function expire(key)
    if expire_at ~= '0' then
      redis.call('PEXPIREAT', key, string.format('%d', tonumber(expire_at) + XH.string_slot(key) % C.INDEX_SPREAD))
    end
  end
  return {x = XH.new(dir, cap, XH.string_slot, expire, true)}
end

-- the tie of each of `members` (false: not in the index), one HMGET per bucket
function TI.ties(t, members)
  local out = {}
  local keys, groups = XH.group(t.x, members)
  for _, key in ipairs(keys) do
    local g = groups[key].items
    local got = redis.call('HMGET', key, unpack(g))
    for j, member in ipairs(g) do out[member] = got[j] and tonumber(got[j]) or false end
  end
  return out
end

-- the tie of one member, or nil
function TI.tie(t, member)
  local got = redis.call('HGET', (XH.bucket(t.x, XH.string_slot(member))), member)
  return got and tonumber(got)
end

-- write members' ties: `put` = {member, tie} pairs, `drop` = members leaving the instance.
-- Per bucket one HDEL and one HSET; where fields were added, a bucket that outgrew the cap
-- splits, and one created now (it holds only the fields just added) gets the instance's expiry.
function TI.write(t, put, drop)
  local items = {}
  for _, pair in ipairs(put) do items[#items + 1] = pair end
  for _, member in ipairs(drop) do items[#items + 1] = {member} end
  local keys, groups = XH.group(t.x, items, function(item) return XH.string_slot(item[1]) end)
  for _, key in ipairs(keys) do
    local g, rem, add = groups[key], {}, {}
    for _, item in ipairs(g.items) do
      if item[2] then
        add[#add + 1] = item[1]
        add[#add + 1] = ENC.score(item[2])
      else
        rem[#rem + 1] = item[1]
      end
    end
    if #rem > 0 then redis.call('HDEL', key, unpack(rem)) end
    -- only new fields can make the bucket outgrow the cap, or be the first of a new key
    local new = #add > 0 and redis.call('HSET', key, unpack(add)) or 0
    if new > 0 and XH.settle(t.x, key, g.d, g.p, new) == new then t.x.expire(key) end
  end
end

-- give every key of the index the instance's expiry again (its period's expiry moved)
function TI.restamp(t)
  local x = t.x
  local n = XH.dir_len(x)
  if n == 0 then return x.expire((XH.bucket(x, 0))) end
  x.expire(x.dir)
  for s = 0, n - 1 do
    local key, _, p = XH.bucket(x, s)
    if p == s then x.expire(key) end  -- each bucket once, at the lowest slot pointing at it
  end
end

-- delete every key of the index: its directory and each of its buckets (a reset)
function TI.destroy(t)
  local x = t.x
  local n = XH.dir_len(x)
  local keys = {(XH.bucket(x, 0))}
  if n > 0 then
    keys[1] = x.dir
    for s = 0, n - 1 do
      local key, _, p = XH.bucket(x, s)
      if p == s then keys[#keys + 1] = key end  -- each bucket once, at the lowest slot pointing at it
    end
  end
  for k = 1, #keys, 1000 do  -- Lua's unpack takes at most ~8000 values
    redis.call('DEL', unpack(keys, k, math.min(k + 999, #keys)))
  end
end

-- one page of the index for backfill from `cursor` (0 to start; XH.next_cursor): {member, tie}
-- pairs of whole buckets, at least `size` unless the walk ends, and the next cursor (-1: done)
function TI.page(t, cursor, size)
  local rows = {}
  while cursor >= 0 and #rows < size do
    local key, d, p = XH.bucket(t.x, cursor)
    local got = redis.call('HGETALL', key)
    for j = 1, #got, 2 do rows[#rows + 1] = {got[j], tonumber(got[j + 1])} end
    cursor = XH.next_cursor(p, d)
  end
  return rows, cursor
end
