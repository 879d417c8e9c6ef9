-- xhash.lua: extendible hashing over small sorted sets or hashes (included by the scripts that
-- include idwindow.lua, the id window, or tieindex.lua, the general layout's tie index).
--
-- Keeps a set of entries (zset member -> score, or hash field -> value) as buckets that each
-- stay under the listpack limit, Redis' compact encoding, however many entries there are:
--   <dir>                  string, one byte per slot: the local depth d of the slot's bucket
--                          (absent: one bucket at depth 0); 2^D slots for global depth D
--   <dir>:<d>:<p>          zset or hash: the bucket of every entry whose 24-bit slot value
--                          v has v mod 2^d = p
-- A bucket that outgrows the cap splits in two by the next bit (doubling the directory when
-- d = D). Buckets never merge, so the directory only grows (XH.next_cursor relies on that).
-- x = XH.new(dir, cap, slot, expire, hash): slot(entry) is the entry's slot value; expire(key)
-- gives a key written by a split its expiry; hash: the buckets are hashes, not zsets.

local XH = {}

-- a directory up to this many bytes is read whole once per call; a longer one slot by slot
local WHOLE_DIR = 4096
XH.MAX_DEPTH = 20  -- a directory of at most 1 MiB: ~90M entries in full listpack buckets

function XH.new(dir, cap, slot, expire, hash)
  return {dir = dir, cap = cap, slot = slot, expire = expire, len = nil, depth = {}, whole = nil,
          hash = hash or false, names = {}}
end

-- the key of bucket (d, p), formatted once per call
local function bucket_key(x, d, p)
  local id = d * 16777216 + p
  local key = x.names[id]
  if key == nil then
    key = string.format('%s:%d:%d', x.dir, d, p)
    x.names[id] = key
  end
  return key
end

-- the slot value of an id fingerprint: its first three bytes
function XH.bytes_slot(fp)
  local b1, b2, b3 = string.byte(fp, 1, 3)
  return b1 + b2 * 256 + b3 * 65536
end

-- the slot value of any string (a member id): djb2 modulo the largest prime below 2^24,
-- computed once per string per script call
local string_slots = {}
function XH.string_slot(s)
  local h = string_slots[s]
  if h then return h end
  local bytes = {string.byte(s, 1, -1)}
  h = 5381
  for k = 1, #bytes do h = (h * 33 + bytes[k]) % 16777213 end
  string_slots[s] = h
  return h
end

function XH.dir_len(x)
  if x.len == nil then x.len = redis.call('STRLEN', x.dir) end
  return x.len
end

-- the local depth of the bucket behind slot s (s < the directory's length)
local function depth_at(x, s, n)
  local d = x.depth[s]
  if d == nil then
    if x.whole == nil and n <= WHOLE_DIR then x.whole = redis.call('GET', x.dir) end
    if x.whole then d = string.byte(x.whole, s + 1)
    else d = string.byte(redis.call('GETRANGE', x.dir, s, s)) end
    x.depth[s] = d
  end
  return d
end

-- the bucket key holding an entry of slot value v, and its local depth and prefix
function XH.bucket(x, v)
  local n = XH.dir_len(x)
  if n == 0 then return bucket_key(x, 0, 0), 0, 0 end
  local d = depth_at(x, v % n, n)
  local p = v % (2 ^ d)
  return bucket_key(x, d, p), d, p
end

-- `items` grouped by bucket (value(item) is its slot value; default: items are entries, x.slot):
-- the bucket keys in first-seen order, and per key {d, p, items}
function XH.group(x, items, value)
  value = value or x.slot
  local groups, keys = {}, {}
  for _, item in ipairs(items) do
    local key, d, p = XH.bucket(x, value(item))
    local g = groups[key]
    if g == nil then
      g = {d = d, p = p, items = {}}
      groups[key] = g
      keys[#keys + 1] = key
    end
    g.items[#g.items + 1] = item
  end
  return keys, groups
end

local function set_depth(x, d, p, depth)
  -- every slot whose value is p modulo 2^d now points at a bucket of local depth `depth`
  local step, ch = 2 ^ d, string.char(depth)
  for s = p, XH.dir_len(x) - 1, step do redis.call('SETRANGE', x.dir, s, ch) end
end

-- a bucket's entries as {entry, value, ...}, the command that adds such pairs, its size
local function entries_of(x, key)
  if x.hash then return redis.call('HGETALL', key) end
  return redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
end

function XH.size(x, key)
  return redis.call(x.hash and 'HLEN' or 'ZCARD', key)
end

-- split bucket (key, d, p) by bit d of its entries' slot values; refused (false) when they all
-- have one slot value, which no split can separate (ids crafted to collide would otherwise
-- deepen the directory to XH.MAX_DEPTH: they leave one oversized bucket instead)
local function split(x, key, d, p)
  local entries = entries_of(x, key)
  local halves, slots = {{}, {}}, {}
  local first, second = 1, 0  -- ZADD takes score then member, HSET field then value
  if x.hash then first, second = 0, 1 end
  for i = 1, #entries, 2 do
    local v = x.slot(entries[i])
    slots[v] = true
    local args = halves[math.floor(v / 2 ^ d) % 2 + 1]
    args[#args + 1] = entries[i + first]
    args[#args + 1] = entries[i + second]
  end
  if next(slots, next(slots)) == nil then return false end
  redis.call('DEL', key)
  if XH.dir_len(x) == 0 then
    redis.call('SET', x.dir, string.char(0))
    x.len = 1
  end
  if 2 ^ d == XH.dir_len(x) then  -- the bucket is at the global depth: double the directory
    redis.call('APPEND', x.dir, redis.call('GET', x.dir))
    x.len = x.len * 2
  end
  set_depth(x, d, p, d + 1)
  x.depth, x.whole = {}, nil  -- the directory changed
  local keys = {bucket_key(x, d + 1, p), bucket_key(x, d + 1, p + 2 ^ d)}
  for half = 1, 2 do
    local args = halves[half]
    if #args > 0 then
      redis.call(x.hash and 'HSET' or 'ZADD', keys[half], unpack(args))
      x.expire(keys[half])
    end
    if #args > 2 * x.cap and d + 1 < XH.MAX_DEPTH then split(x, keys[half], d + 1, p + (half - 1) * 2 ^ d) end
  end
  return true
end

-- after `new` entries were added to bucket (key, d, p): split it if it outgrew the cap (returns
-- -1), else return how many entries it holds. A split is tried when the bucket grows past a
-- multiple of the cap: past the cap itself, and for a bucket a split could not separate past
-- the next multiple, so its writes stay cheap.
function XH.settle(x, key, d, p, new)
  return XH.settle_at(x, key, d, p, new, XH.size(x, key))
end

-- XH.settle when the caller knows how many entries the bucket holds now (`card`)
function XH.settle_at(x, key, d, p, new, card)
  local cap = x.cap
  if d < XH.MAX_DEPTH and card > cap and math.floor((card - new - 1) / cap) < math.floor((card - 1) / cap)
     and split(x, key, d, p) then
    x.expire(x.dir)
    return -1
  end
  return card
end

-- d bits of v in reverse order
local function reverse_bits(v, d)
  local r = 0
  for _ = 1, d do
    r = r * 2 + v % 2
    v = math.floor(v / 2)
  end
  return r
end

-- A walk's cursor after the bucket of depth d and prefix p: the next prefix in reverse-bit
-- order (Redis' own SCAN cursor), or -1 when every bucket was visited. Every entry present for
-- the whole walk is visited once, however the buckets split meanwhile: a split bucket's
-- halves extend its prefix by a high bit, which reverse-bit order visits together.
function XH.next_cursor(p, d)
  if d == 0 then return -1 end
  local r = reverse_bits(p, d) + 1
  if r == 2 ^ d then return -1 end
  return reverse_bits(r, d)
end

