-- idwindow.lua: the board's id window (included by apply.lua; see common/idwindow.py).
--
-- Remembers each applied event's id fingerprint (10 bytes, computed by the worker) with the
-- second it was applied, for at least the id window. Stored as small sorted sets in Redis'
-- compact listpack encoding, addressed by extendible hashing so that each stays under the
-- listpack limit however many ids a board has:
--   <dir>                  string, one byte per slot: the local depth d of the slot's bucket
--                          (absent: one bucket at depth 0); 2^D slots for global depth D
--   <dir>:<d>:<p>          zset fingerprint -> applied-at second: the bucket of every id whose
--                          24-bit slot value v has v mod 2^d = p
-- Each write to a bucket first drops its expired entries (the oldest, at the front of the
-- listpack), so a bucket holds only ids still in the window; a bucket that then outgrows the
-- listpack limit splits in two by the next bit (doubling the directory when d = D). Every key
-- expires one window after its last insert, so an idle board's window disappears whole.

local IDW = {}

function IDW.new(dir, window_s, cap)
  return {dir = dir, window = window_s, cap = cap, len = nil, now = nil, pending = {}, order = {},
          depth = {}, whole = nil, found = {}}
end

-- a directory up to this many bytes is read whole once per call; a longer one slot by slot
local WHOLE_DIR = 4096

local MAX_DEPTH = 24

local function slot_value(fp)
  local b1, b2, b3 = string.byte(fp, 1, 3)
  return b1 + b2 * 256 + b3 * 65536
end

local function now_s(w)
  if w.now == nil then w.now = tonumber(redis.call('TIME')[1]) end
  return w.now
end

local function dir_len(w)
  if w.len == nil then w.len = redis.call('STRLEN', w.dir) end
  return w.len
end

-- the bucket key holding fingerprint fp, and its local depth and prefix
local function bucket(w, fp)
  local v, n = slot_value(fp), dir_len(w)
  if n == 0 then return w.dir .. ':0:0', 0, 0 end
  local s = v % n
  local d = w.depth[s]
  if d == nil then
    if w.whole == nil and n <= WHOLE_DIR then w.whole = redis.call('GET', w.dir) end
    if w.whole then d = string.byte(w.whole, s + 1)
    else d = string.byte(redis.call('GETRANGE', w.dir, s, s)) end
    w.depth[s] = d
  end
  local p = v % (2 ^ d)
  return string.format('%s:%d:%d', w.dir, d, p), d, p
end

-- `fps` grouped by bucket: the bucket keys in first-seen order, and per key {d, p, fps}
local function by_bucket(w, fps)
  local groups, keys = {}, {}
  for _, fp in ipairs(fps) do
    local key, d, p = bucket(w, fp)
    local g = groups[key]
    if g == nil then
      g = {d = d, p = p, fps = {}}
      groups[key] = g
      keys[#keys + 1] = key
    end
    g.fps[#g.fps + 1] = fp
  end
  return keys, groups
end

-- phase 1: read when each of `fps` was applied (one ZMSCORE per bucket)
function IDW.prefetch(w, fps)
  local wanted = {}
  for _, fp in ipairs(fps) do
    if w.found[fp] == nil then
      w.found[fp] = false
      wanted[#wanted + 1] = fp
    end
  end
  local keys, groups = by_bucket(w, wanted)
  for _, key in ipairs(keys) do
    local g = groups[key].fps
    local at = redis.call('ZMSCORE', key, unpack(g))
    for j, fp in ipairs(g) do w.found[fp] = at[j] and tonumber(at[j]) or false end
  end
end

-- was fp applied less than the window ago (or earlier in this call)?
function IDW.seen(w, fp)
  if w.pending[fp] then return true end
  local at = w.found[fp]
  if at == nil then
    at = redis.call('ZSCORE', (bucket(w, fp)), fp)
    at = at and tonumber(at)
  end
  return at ~= false and now_s(w) - at < w.window
end

-- remember fp (phase 1: queued; written by IDW.flush)
function IDW.add(w, fp)
  if not w.pending[fp] then
    w.pending[fp] = true
    w.order[#w.order + 1] = fp
  end
end

local function set_depth(w, d, p, depth)
  -- every slot whose value is p modulo 2^d now points at a bucket of local depth `depth`
  local step, ch = 2 ^ d, string.char(depth)
  for s = p, dir_len(w) - 1, step do redis.call('SETRANGE', w.dir, s, ch) end
end

local function split(w, key, d, p)
  local entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  redis.call('DEL', key)
  if dir_len(w) == 0 then
    redis.call('SET', w.dir, string.char(0))
    w.len = 1
  end
  if 2 ^ d == dir_len(w) then  -- the bucket is at the global depth: double the directory
    redis.call('APPEND', w.dir, redis.call('GET', w.dir))
    w.len = w.len * 2
  end
  set_depth(w, d, p, d + 1)
  w.depth, w.whole = {}, nil  -- the directory changed
  local keys = {string.format('%s:%d:%d', w.dir, d + 1, p), string.format('%s:%d:%d', w.dir, d + 1, p + 2 ^ d)}
  local halves = {{}, {}}
  for i = 1, #entries, 2 do
    local args = halves[math.floor(slot_value(entries[i]) / 2 ^ d) % 2 + 1]
    args[#args + 1] = entries[i + 1]
    args[#args + 1] = entries[i]
  end
  for half = 1, 2 do
    local args = halves[half]
    if #args > 0 then
      redis.call('ZADD', keys[half], unpack(args))
      redis.call('PEXPIRE', keys[half], (w.window + 1) * 1000)
    end
    if #args > 2 * w.cap and d + 1 < MAX_DEPTH then split(w, keys[half], d + 1, p + (half - 1) * 2 ^ d) end
  end
end

-- phase 2: write the queued fingerprints, one ZADD per bucket, splitting what outgrew the cap
function IDW.flush(w)
  if #w.order == 0 then return end
  local now, ttl = string.format('%d', now_s(w)), (w.window + 1) * 1000
  local keys, groups = by_bucket(w, w.order)  -- every bucket before any split changes the directory
  local stale = '(' .. string.format('%d', now_s(w) - w.window + 1)  -- applied a window ago or more
  for _, key in ipairs(keys) do
    local g, args = groups[key], {}
    for _, fp in ipairs(g.fps) do
      args[#args + 1] = now
      args[#args + 1] = fp
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', stale)
    redis.call('ZADD', key, unpack(args))
    if g.d < MAX_DEPTH and redis.call('ZCARD', key) > w.cap then
      split(w, key, g.d, g.p)
    else
      redis.call('PEXPIRE', key, ttl)
    end
  end
  if dir_len(w) > 0 then redis.call('PEXPIRE', w.dir, ttl) end
end
