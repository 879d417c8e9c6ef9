-- guarded.lua: runs the writes the worker decided for one board's events (worker/decide.py)
-- if, and only if, the board is still as the worker last read it; else writes nothing.
--! include xhash
--! include overflow
--
-- KEYS: K.SEQ, K.FENCE, K.SLOT (the slot's mark; the fence when unmarked), K.MOVING (never
--       written: a call during a slot migration is refused on both sides, as apply.lua's is),
--       K.PROMOTED (read: an API node's registration of the board),
--       then the keys the checks and the write list name by position.
-- ARGV: the header G, then G.NF fence (field, value the worker read: '' = absent), G.ND
--       directories (key position, length the worker read), G.NX hash fields that must be as
--       the worker read them (key position, field, value or '' for none), G.NR directory bytes
--       likewise (key position, position, the byte or '' for none): a next rolling period's tie
--       index, which its preparer writes outside the seq, G.NP probes (key position, 'z' or
--       'h': a zset or hash it writes), G.NS period markers (key position: a period whose result
--       may be sealed, worker/results.py), G.NU markers of next rolling periods the writes leave
--       alone because their preparation has not begun (key position: none may exist), G.NG id
--       groups (bucket key position, count, fingerprints...), then G.NO writes:
--   'c' name, key position, count, arguments...   one command
--   'i' bucket, directory, depth, prefix, count, fingerprints...
--        the id window's bucket: its expired entries go, the fingerprints are added at Redis'
--        TIME (idwindow.lua IDW.flush), the bucket splits if it outgrew the cap
--   't' bucket, directory, depth, prefix, expire at ('0' = never), count, fields...,
--        count, (field, tie)...   a tie index bucket: HDEL, HSET, a split if it outgrew the
--        cap, a new bucket's expiry (tieindex.lua TI.write)
--   'r' rank, overflow, count, max_members, '1' if descending   max_members: the best of the
--        overflow move up (as many as the count of members just written), the excess down
-- Every check reads each key it writes with the type it writes (the id buckets through the id
-- check, the directories through their length, the probes), so a key of another type in the
-- board's place fails the call before its first write: nothing is ever half written.
-- Returns {1, (directory position, its value)...} once written, with every directory a split
-- changed; {3, marker position...} when those periods' results are sealed (final: the worker
-- leaves them alone and decides again); {0} when the seq, a fence field or a directory's length
-- or a value is not what the worker read (someone else wrote the board since: nothing written);
-- {2, fingerprint...} when those ids were applied less than the id window ago (nothing
-- written); {4} when a next rolling period's preparation began (apply.lua writes the chunk:
-- nothing written); {5, 0 | 1} when the board's registration by an API node (K.PROMOTED exists)
-- is not what G.PROMOTED says (nothing written: the worker learns it, and writes through apply.lua); {-1, epoch} a fence of another epoch, {-1, ''} no fence and no slot mark (apply.lua's
-- answers: nothing written).
local function key(pos) return KEYS[tonumber(pos)] end
local fields = {'e'}
local at = G._N
for k = 1, tonumber(ARGV[G.NF]) do fields[k + 1] = ARGV[at + 2 * k - 1] end
local stored = redis.call('HMGET', KEYS[K.FENCE], unpack(fields))
local epoch = ARGV[G.EPOCH]
if stored[1] and stored[1] ~= epoch then return {-1, stored[1]} end
if not stored[1] and ARGV[G.MARKED] == '1' and redis.call('EXISTS', KEYS[K.SLOT]) == 0 then
  return {-1, ''}
end
local promoted = redis.call('EXISTS', KEYS[K.PROMOTED])
if promoted ~= (ARGV[G.PROMOTED] == '1' and 1 or 0) then return {5, promoted} end
if (redis.call('GET', KEYS[K.SEQ]) or '0') ~= ARGV[G.EXPECT] then return {0} end
for k = 1, tonumber(ARGV[G.NF]) do
  if (stored[k + 1] or '') ~= ARGV[at + 2 * k] then return {0} end
end
at = at + 2 * tonumber(ARGV[G.NF])
for _ = 1, tonumber(ARGV[G.ND]) do
  if redis.call('STRLEN', key(ARGV[at + 1])) ~= tonumber(ARGV[at + 2]) then return {0} end
  at = at + 2
end
for _ = 1, tonumber(ARGV[G.NX]) do
  if (redis.call('HGET', key(ARGV[at + 1]), ARGV[at + 2]) or '') ~= ARGV[at + 3] then return {0} end
  at = at + 3
end
for _ = 1, tonumber(ARGV[G.NR]) do
  if redis.call('GETRANGE', key(ARGV[at + 1]), ARGV[at + 2], ARGV[at + 2]) ~= ARGV[at + 3] then return {0} end
  at = at + 3
end
local held = {}  -- key position -> entries before the writes (a tie index bucket's size)
for _ = 1, tonumber(ARGV[G.NP]) do
  held[ARGV[at + 1]] = redis.call(ARGV[at + 2] == 'z' and 'ZCARD' or 'HLEN', key(ARGV[at + 1]))
  at = at + 2
end
local sealed = {3}
for _ = 1, tonumber(ARGV[G.NS]) do
  local mark = redis.call('GET', key(ARGV[at + 1]))
  if mark and string.byte(mark, 1) == 115 then sealed[#sealed + 1] = tonumber(ARGV[at + 1]) end  -- 's'
  at = at + 1
end
if #sealed > 1 then return sealed end
for _ = 1, tonumber(ARGV[G.NU]) do
  if redis.call('EXISTS', key(ARGV[at + 1])) == 1 then return {4} end
  at = at + 1
end
local window = tonumber(ARGV[G.WINDOW])
local now = tonumber(redis.call('TIME')[1])
local dups = {2}
for _ = 1, tonumber(ARGV[G.NG]) do
  local n = tonumber(ARGV[at + 2])
  local got = redis.call('ZMSCORE', key(ARGV[at + 1]), unpack(ARGV, at + 3, at + 2 + n))
  for j = 1, n do
    if got[j] and now - tonumber(got[j]) < window then dups[#dups + 1] = ARGV[at + 2 + j] end
  end
  at = at + 2 + n
end
if #dups > 1 then return dups end

-- the writes
local cap = tonumber(ARGV[G.CAP])
local xs, split = {}, {}  -- directory position -> its xhash; -> changed by a split
local function ids(dir)
  local x = xs[dir]
  if x == nil then
    local function expire(k) redis.call('PEXPIRE', k, (window + 1) * 1000) end
    x = XH.new(key(dir), cap, XH.bytes_slot, expire)
    xs[dir] = x
  end
  return x
end
local function index(dir, expire_at)
  local x = xs[dir]
  if x == nil then
    local function expire(k)
      if expire_at ~= '0' then
        redis.call('PEXPIREAT', k, string.format('%d', tonumber(expire_at) + XH.string_slot(k) % C.INDEX_SPREAD))
      end
    end
    x = XH.new(key(dir), cap, XH.string_slot, expire, true)
    xs[dir] = x
  end
  return x
end
local stale = '(' .. string.format('%d', now - window + 1)  -- applied a window ago or more
local stamp = string.format('%d', now)
for _ = 1, tonumber(ARGV[G.NO]) do
  local op = ARGV[at + 1]
  if op == 'c' then
    local n = tonumber(ARGV[at + 4])
    redis.call(ARGV[at + 2], key(ARGV[at + 3]), unpack(ARGV, at + 5, at + 4 + n))
    at = at + 4 + n
  elseif op == 'i' then
    local bucket, dir, d, p, n = key(ARGV[at + 2]), ARGV[at + 3], tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]), tonumber(ARGV[at + 6])
    local args = {}
    for j = 1, n do
      args[2 * j - 1] = stamp
      args[2 * j] = ARGV[at + 6 + j]
    end
    local x = ids(dir)
    redis.call('ZREMRANGEBYSCORE', bucket, '-inf', stale)
    local new = redis.call('ZADD', bucket, unpack(args))
    local card = XH.settle(x, bucket, d, p, new)
    if card >= 0 then x.expire(bucket) else split[dir] = true end
    at = at + 6 + n
  elseif op == 'r' then
    OV.rebalance(key(ARGV[at + 2]), key(ARGV[at + 3]), tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]), ARGV[at + 6] == '1')
    at = at + 6
  else  -- 't'
    local bucket, dir, d, p, expire_at = key(ARGV[at + 2]), ARGV[at + 3], tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]), ARGV[at + 6]
    local x, card = index(dir, expire_at), held[ARGV[at + 2]]  -- probed before the first write
    local nd = tonumber(ARGV[at + 7])
    if nd > 0 then card = card - redis.call('HDEL', bucket, unpack(ARGV, at + 8, at + 7 + nd)) end
    at = at + 7 + nd
    local np = tonumber(ARGV[at + 1])
    local new = np > 0 and redis.call('HSET', bucket, unpack(ARGV, at + 2, at + 1 + 2 * np)) or 0
    if new > 0 then
      card = XH.settle_at(x, bucket, d, p, new, card + new)
      if card == new then x.expire(bucket) elseif card < 0 then split[dir] = true end
    end
    at = at + 1 + 2 * np
  end
end
-- the id window's directory lives one window after its last insert (IDW.flush)
for dir, x in pairs(xs) do
  if not x.hash and XH.dir_len(x) > 0 then x.expire(x.dir) end
end
if ARGV[G.NEW_SEQ] ~= '' then redis.call('SET', KEYS[K.SEQ], ARGV[G.NEW_SEQ]) end
-- last, as apply.lua: the API nodes' warm caches drop the board (api/warm.py)
if ARGV[G.NOTIFY] ~= '' then redis.call('PUBLISH', ARGV[G.NOTIFY], ARGV[G.MESSAGE]) end
local out = {1}
for dir in pairs(split) do
  out[#out + 1] = tonumber(dir)
  out[#out + 1] = redis.call('GET', key(dir)) or ''
end
return out
