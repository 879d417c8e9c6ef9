-- apply.lua: apply a batch of update events of ONE board, atomically and idempotently.
--
-- KEYS: [1] board seq, [2] board meta hash,
--       then per window instance i = 1..W: rank zset, overflow zset, state hash (KEYS[3i..3i+2]),
--       then per event e = 1..E: its dedupe key (KEYS[2 + 3W + e]).
-- ARGV: [1] W, [2] E, [3] tie mode inv|fwd|none, [4] desc 1|0, [5] max_members (0 = no limit),
--       [6] dedupe ttl ms, [7] want state 1|0, then W expire-at ms (0 = never),
--       then per event 6 fields: op, member, score, tie ms, meta ('' = none), window mask
--       (bit i-1 set = the event counts in instance i).
-- Returns, per event: status (1 applied, 0 duplicate, 2 score out of range), board seq, and
-- when "want state" (hot boards): per instance in its mask, "<score>|<tie ms>" or "" for an
-- absent member, then the member's meta ('' if none), so update_cache always carries it.
--
-- The zset score is the exact score; the member is prefixed with its tie time in fixed-width
-- hex (see common/ranking.py) so Redis' bytewise order of equal scores is the tie rule.

local W, E = tonumber(ARGV[1]), tonumber(ARGV[2])
local mode, desc, maxm = ARGV[3], ARGV[4] == '1', tonumber(ARGV[5])
local ttl, want_state = ARGV[6], ARGV[7] == '1'
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
    local old = redis.call('HGET', KEYS[3 * i + 2], member)
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
  local rk, ov, st = KEYS[3 * i], KEYS[3 * i + 1], KEYS[3 * i + 2]
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

local out, touched, dirty, applied_ids, meta_dirty = {}, {}, {}, {}, {}
local seq0 = tonumber(redis.call('GET', KEYS[1]) or '0')
local seq = seq0
local base = 7 + W
for e = 1, E do
  local at = base + (e - 1) * 6
  local op, member, score = ARGV[at + 1], ARGV[at + 2], tonumber(ARGV[at + 3])
  local tie, meta, mask = tonumber(ARGV[at + 4]), ARGV[at + 5], tonumber(ARGV[at + 6])
  local dedupe = KEYS[2 + 3 * W + e]
  local seen = applied_ids[dedupe] or redis.call('EXISTS', dedupe) == 1
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
  local status
  if seen then
    status = 0  -- a duplicate of an applied event is a duplicate, whatever it would do now
  elseif not in_range then
    status = 2
  else
    status = 1
    applied_ids[dedupe] = true
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
  out[#out + 1] = status
  out[#out + 1] = seq
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
for dedupe in pairs(applied_ids) do redis.call('SET', dedupe, '1', 'PX', ttl) end
for member in pairs(meta_dirty) do
  local m = metas[member]
  if m == '' then redis.call('HDEL', KEYS[2], member) else redis.call('HSET', KEYS[2], member, m) end
end
for _, d in ipairs(dirty) do flush(d[1], d[2], d[3]) end
if seq ~= seq0 then redis.call('SET', KEYS[1], seq) end

for i = 1, W do
  local expire_at = ARGV[7 + i]
  if touched[i] and expire_at ~= '0' then
    for k = 0, 2 do redis.call('PEXPIREAT', KEYS[3 * i + k], expire_at) end
  end
end
return out
