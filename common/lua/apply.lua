-- apply.lua: apply a batch of update events of ONE board, atomically and exactly once.
--! include idwindow
--
-- KEYS: [1] board seq, [2] board meta hash, [3] board fence hash, [4] id window directory,
--       then per window instance i = 1..W: rank zset, overflow zset, state hash (KEYS[2+3i..4+3i]).
-- ARGV: header (see H below), then S sources x 3 (fence field, topic id, low water), then W
--       expire-at ms (0 = never), then per event F fields: op, member, score, tie ms, meta
--       ('' = none), window mask (bit i-1 set = the event counts in instance i), offset, where
--       (source number * 1000 + array index + 1; 0 = no source), id fingerprint, and while
--       adopting a previous release's board the key of its record of the id (common/keys.py).
-- Returns, per event: status (ST below; worker/apply.py Status), board seq, for FAILED the error
-- class its first delivery raised (op 'x' records that), and when "want state"
-- (hot boards): per instance in its mask, "<score>|<tie ms>" or "" for an absent member, then
-- the member's meta ('' if none), so update_cache always carries it. A board whose fence
-- belongs to another epoch returns {-1, <its epoch>} and changes nothing.
--
-- Exactly once: the fence keeps, per source (topic, partition), the topic id and the last
-- (offset, where) applied, and the positions of events the script rejected since the source's
-- low water (the worker's last committed offset). An event at or before the fence changes
-- nothing and reports what its first delivery reported. A new event whose id fingerprint was
-- applied less than the id window ago is a producer duplicate.
--
-- The zset score is the exact score; the member is prefixed with its tie time in fixed-width
-- hex (see common/ranking.py) so Redis' bytewise order of equal scores is the tie rule.

local H = {W = 1, E = 2, MODE = 3, DESC = 4, MAXM = 5, STATE = 6, EPOCH = 7, WINDOW = 8, CAP = 9,
           LEGACY_TTL = 10, S = 11}
local W, E = tonumber(ARGV[H.W]), tonumber(ARGV[H.E])
local mode, desc, maxm = ARGV[H.MODE], ARGV[H.DESC] == '1', tonumber(ARGV[H.MAXM])
local want_state, epoch = ARGV[H.STATE] == '1', ARGV[H.EPOCH]
local legacy_ttl, S = ARGV[H.LEGACY_TTL], tonumber(ARGV[H.S])
local legacy = legacy_ttl ~= '0'
local F = legacy and 10 or 9
local ST = {DUPLICATE = 0, APPLIED = 1, OUT_OF_RANGE = 2, REDELIVERED = 3, FAILED = 4}
local KI = 4  -- KEYS before the instances
-- EXACT = 2^53 - 1: see common/ranking.py for why the bound is one below 2^53
local TIE_MAX, EXACT = 281474976710655, 9007199254740991

local function fmt(x)
  if x == math.floor(x) and math.abs(x) <= EXACT then return string.format('%d', x) end
  return string.format('%.17g', x)
end

local function enc(tie, member)
  if mode == 'inv' then return string.format('%012x', TIE_MAX - tie) .. member end
  if mode == 'fwd' then return string.format('%012x', tie) .. member end
  return member
end

local function better(a, b)
  if desc then return a > b end
  return a < b
end

-- keep the rank zset exactly the best maxm members; the rest wait in the overflow zset
local function rebalance(rk, ov)
  if redis.call('ZCARD', ov) > 0 then
    local best = desc and redis.call('ZRANGE', ov, -1, -1, 'WITHSCORES') or redis.call('ZRANGE', ov, 0, 0, 'WITHSCORES')
    redis.call('ZREM', ov, best[1])
    redis.call('ZADD', rk, best[2], best[1])
  end
  while redis.call('ZCARD', rk) > maxm do
    local worst = desc and redis.call('ZRANGE', rk, 0, 0, 'WITHSCORES') or redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
    redis.call('ZREM', rk, worst[1])
    redis.call('ZADD', ov, worst[2], worst[1])
  end
end

local function in_mask(mask, i)
  return math.floor(mask / 2 ^ (i - 1)) % 2 == 1
end

-- Per call, each (instance, member) is read from Redis once and written once, at the end:
-- a burst of events from one member costs one write. c.rtie = the tie of the entry in Redis.
local cache = {}
local function load(i, member)
  local ci = cache[i]
  if ci == nil then ci = {}; cache[i] = ci end
  local c = ci[member]
  if c == nil then
    local old = redis.call('HGET', KEYS[KI + 3 * i], member)
    if old then
      local bar = string.find(old, '|', 1, true)
      local t = tonumber(string.sub(old, bar + 1))
      c = {present = true, score = tonumber(string.sub(old, 1, bar - 1)), tie = t, rtie = t}
    else
      c = {present = false}
    end
    ci[member] = c
  end
  return c
end

-- the planned new score of one member in one instance: nil = unchanged, false = delete
local function plan(c, op, score)
  if op == 'delete' then
    if c.present then return false end
    return nil
  end
  local new
  if op == 'incr' then new = (c.present and c.score or 0) + score
  elseif op == 'set' then new = score
  elseif not c.present or better(score, c.score) then new = score  -- best
  else new = c.score end
  if c.present and new == c.score then return nil end  -- unchanged: keeps the time it got there
  return new
end

local function flush(i, member, c)
  local rk, ov, st = KEYS[KI + 3 * i - 2], KEYS[KI + 3 * i - 1], KEYS[KI + 3 * i]
  if c.rtie then
    local old_member = enc(c.rtie, member)
    -- with no tie prefix the member is unchanged and ZADD below overwrites its score
    if not (mode == 'none' and c.present) then redis.call('ZREM', rk, old_member) end
    if maxm > 0 then redis.call('ZREM', ov, old_member) end
  end
  if c.present then
    redis.call('HSET', st, member, fmt(c.score) .. '|' .. fmt(c.tie))
    redis.call('ZADD', rk, fmt(c.score), enc(c.tie, member))
  else
    redis.call('HDEL', st, member)
  end
  if maxm > 0 then rebalance(rk, ov) end
end

-- Two phases: every read and decision first, every write after the last event is decided. A
-- script that raises midway has then written nothing, so the worker can narrow a failed call
-- down to its event by re-applying one event at a time (worker/apply.py) without losing or
-- double-counting anything.
local metas = {}  -- member -> meta after this call's events ('' = none); read once
local function meta_of(member)
  local m = metas[member]
  if m == nil then
    m = redis.call('HGET', KEYS[2], member) or ''
    metas[member] = m
  end
  return m
end

-- the fence: per source its stored position and the positions rejected since the low water
-- (positions as exact integer text: Lua's own number-to-text turns 10^14 into '1e+14')
local function pos_key(offset, sub) return string.format('%d:%d', offset, sub) end
local sources, fields = {}, {'e'}
local at = H.S
for k = 1, S do
  local src = {field = ARGV[at + 1], topic = ARGV[at + 2], low = tonumber(ARGV[at + 3]), rejected = {}}
  at = at + 3
  sources[k] = src
  fields[#fields + 1] = src.field
  fields[#fields + 1] = src.field .. '!r'
end
local stored = redis.call('HMGET', KEYS[3], unpack(fields))
if stored[1] and stored[1] ~= epoch then return {-1, stored[1]} end
local fence_dirty = not stored[1]
for k, src in ipairs(sources) do
  local value, rej = stored[2 * k], stored[2 * k + 1]
  src.offset, src.where = -1, -1
  src.had_rejections = rej ~= false  -- rewritten (or dropped) when the fence moves
  if value then
    local topic, o, wh = string.match(value, '^(.-)|(%d+)|(%d+)$')
    if topic == src.topic then  -- another topic id: the topic was recreated, start over
      src.offset, src.where = tonumber(o), tonumber(wh)
      if rej then
        for ro, rw, why in string.gmatch(rej, '(%d+):(%d+):?([%w_]*)') do
          if tonumber(ro) > src.low then src.rejected[pos_key(tonumber(ro), tonumber(rw))] = why end
        end
      end
    end
  end
  src.changed = false
end
local expires_at = at
at = at + W

local ids = IDW.new(KEYS[4], tonumber(ARGV[H.WINDOW]), tonumber(ARGV[H.CAP]))
local legacy_new = {}

local out, touched, dirty, meta_dirty = {}, {}, {}, {}
local seq0 = tonumber(redis.call('GET', KEYS[1]) or '0')
local seq = seq0
for e = 1, E do
  local op, member, score = ARGV[at + 1], ARGV[at + 2], tonumber(ARGV[at + 3])
  local tie, meta, mask = tonumber(ARGV[at + 4]), ARGV[at + 5], tonumber(ARGV[at + 6])
  local offset, where, fp = tonumber(ARGV[at + 7]), tonumber(ARGV[at + 8]), ARGV[at + 9]
  local legacy_key = legacy and ARGV[at + 10] or nil  -- the previous release's record of the id
  at = at + F
  local src = where > 0 and sources[math.floor(where / 1000)] or nil
  local sub = where % 1000
  local status, failed_as
  local fenced = src and (offset < src.offset or (offset == src.offset and sub <= src.where))
  if fenced then
    -- redelivered: changes nothing, reports what its first delivery reported
    local why = src.rejected[pos_key(offset, sub)]
    if why == nil then status = ST.REDELIVERED
    elseif why == '' then status = ST.OUT_OF_RANGE
    else status, failed_as = ST.FAILED, why end
  elseif op == 'x' then
    -- the worker's record of an event whose processing raised (its member names the error
    -- class): a redelivery of it is dead-lettered again, not taken for applied
    status, failed_as = ST.FAILED, member
    if src then src.rejected[pos_key(offset, sub)] = member end
  elseif IDW.seen(ids, fp) or (legacy and (legacy_new[legacy_key] or redis.call('EXISTS', legacy_key) == 1)) then
    status = ST.DUPLICATE  -- a duplicate of an applied event is a duplicate, whatever it would do now
  else
    -- plan every instance before changing any, so an out-of-range result changes nothing
    local plans, in_range = {}, true
    for i = 1, W do
      if in_mask(mask, i) then
        local c = load(i, member)
        local new = plan(c, op, score)
        if new and math.abs(new) > EXACT then in_range = false end
        plans[i] = {new, c}
      end
    end
    if not in_range then
      status = ST.OUT_OF_RANGE
      if src then src.rejected[pos_key(offset, sub)] = '' end
    else
      status = ST.APPLIED
      IDW.add(ids, fp)
      if legacy then legacy_new[legacy_key] = true end
      seq = seq + 1
      for i = 1, W do
        local p = plans[i]
        if p and p[1] ~= nil then
          local c = p[2]
          if p[1] == false then c.present = false
          else c.present, c.score, c.tie = true, p[1], tie end
          if not c.dirty then
            c.dirty = true
            dirty[#dirty + 1] = {i, member, c}
          end
          touched[i] = true
        end
      end
      if op == 'delete' or meta ~= '' then
        metas[member] = op == 'delete' and '' or meta
        meta_dirty[member] = true
      end
    end
  end
  if src and not fenced then src.offset, src.where, src.changed = offset, sub, true end
  out[#out + 1] = status
  out[#out + 1] = seq
  if status == ST.FAILED then out[#out + 1] = failed_as end
  if want_state then
    for i = 1, W do
      if in_mask(mask, i) then
        local c = load(i, member)
        out[#out + 1] = c.present and (fmt(c.score) .. '|' .. fmt(c.tie)) or ''
      end
    end
    out[#out + 1] = meta_of(member)
  end
end

-- phase 2: the writes
IDW.flush(ids)
if legacy then
  for key in pairs(legacy_new) do redis.call('SET', key, '1', 'PX', legacy_ttl) end
end
local fence_args = {}
for _, src in ipairs(sources) do
  if src.changed then
    fence_args[#fence_args + 1] = src.field
    fence_args[#fence_args + 1] = src.topic .. '|' .. string.format('%d', src.offset) .. '|' .. src.where
    local list = {}
    for pos, why in pairs(src.rejected) do list[#list + 1] = why == '' and pos or pos .. ':' .. why end
    if #list > 0 then
      table.sort(list)
      fence_args[#fence_args + 1] = src.field .. '!r'
      fence_args[#fence_args + 1] = table.concat(list, ' ')
    elseif src.had_rejections then
      redis.call('HDEL', KEYS[3], src.field .. '!r')
    end
  end
end
if #fence_args > 0 then
  if fence_dirty then fence_args[#fence_args + 1] = 'e'; fence_args[#fence_args + 1] = epoch end
  redis.call('HSET', KEYS[3], unpack(fence_args))
end
for member in pairs(meta_dirty) do
  local m = metas[member]
  if m == '' then redis.call('HDEL', KEYS[2], member) else redis.call('HSET', KEYS[2], member, m) end
end
for _, d in ipairs(dirty) do flush(d[1], d[2], d[3]) end
if seq ~= seq0 then redis.call('SET', KEYS[1], seq) end

for i = 1, W do
  local expire_at = ARGV[expires_at + i]
  if touched[i] and expire_at ~= '0' then
    for k = -2, 0 do redis.call('PEXPIREAT', KEYS[KI + 3 * i + k], expire_at) end
  end
end
return out
