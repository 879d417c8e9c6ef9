-- locate.lua: score, position and "members strictly better" of several members, one round trip.
-- KEYS: [1] rank zset, [2] overflow zset, [3] state hash, [4] meta hash, [5] board seq
-- ARGV: [1] desc 1|0, [2] reverse 1|0, [3] tie mode inv|fwd|none, then the members
-- Returns {total, seq, then per member: state ('' if absent), position (0-based in the view,
-- -1 if absent), strictly-better count in the view (-1 if absent), meta ('' if none)}.
local desc, reverse, mode = ARGV[1] == '1', ARGV[2] == '1', ARGV[3]
local TIE_MAX = 281474976710655
local R, O = redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])
local total = R + O
local high_first = desc ~= reverse

local function enc(tie, member)  -- the same encoding as apply.lua
  if mode == 'inv' then return string.format('%012x', TIE_MAX - tie) .. member end
  if mode == 'fwd' then return string.format('%012x', tie) .. member end
  return member
end

local function natural_position(m)
  local rank = desc and redis.call('ZREVRANK', KEYS[1], m) or redis.call('ZRANK', KEYS[1], m)
  if rank then return rank end
  rank = desc and redis.call('ZREVRANK', KEYS[2], m) or redis.call('ZRANK', KEYS[2], m)
  return R + rank
end

local out = {total, tonumber(redis.call('GET', KEYS[5]) or '0')}
for k = 4, #ARGV do
  local member = ARGV[k]
  local state = redis.call('HGET', KEYS[3], member)
  if not state then
    out[#out + 1] = ''; out[#out + 1] = -1; out[#out + 1] = -1; out[#out + 1] = ''
  else
    local bar = string.find(state, '|', 1, true)
    local score, tie = string.sub(state, 1, bar - 1), tonumber(string.sub(state, bar + 1))
    local pos = natural_position(enc(tie, member))
    if reverse then pos = total - 1 - pos end
    local better
    if high_first then
      better = redis.call('ZCOUNT', KEYS[1], '(' .. score, '+inf') + redis.call('ZCOUNT', KEYS[2], '(' .. score, '+inf')
    else
      better = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. score) + redis.call('ZCOUNT', KEYS[2], '-inf', '(' .. score)
    end
    out[#out + 1] = state
    out[#out + 1] = pos
    out[#out + 1] = better
    out[#out + 1] = redis.call('HGET', KEYS[4], member) or ''
  end
end
return out
