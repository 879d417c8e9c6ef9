-- locate.lua: score, position and "members strictly better" of several members, one round trip.
--! include encoding
-- KEYS (positions in K, ARGV in A; common/store/reads.py): rank zset, overflow zset, state
--       hash, meta hash, board seq. ARGV: desc 1|0, reverse 1|0, tie mode inv|fwd|none, then
--       the members.
-- Returns {total, seq, then per member (positions in M): state ('' if absent), position
-- (0-based in the view, -1 if absent), strictly-better count in the view (-1 if absent), meta
-- ('' if none)}.
local desc, reverse, mode = ARGV[A.DESC] == '1', ARGV[A.REVERSE] == '1', ARGV[A.MODE]
local RK, OV = KEYS[K.RANK], KEYS[K.OVERFLOW]
local R, O = redis.call('ZCARD', RK), redis.call('ZCARD', OV)
local total = R + O
local high_first = desc ~= reverse

local function enc(tie, member) return ENC.member(mode, tie, member) end

local function natural_position(m)
  local rank = desc and redis.call('ZREVRANK', RK, m) or redis.call('ZRANK', RK, m)
  if rank then return rank end
  rank = desc and redis.call('ZREVRANK', OV, m) or redis.call('ZRANK', OV, m)
  return R + rank
end

local out = {total, tonumber(redis.call('GET', KEYS[K.SEQ]) or '0')}
for k = A._N + 1, #ARGV do
  local member = ARGV[k]
  local state = redis.call('HGET', KEYS[K.STATE], member)
  local row = {}
  if not state then
    row[M.STATE], row[M.POSITION], row[M.BETTER], row[M.META] = '', -1, -1, ''
  else
    local score, tie = ENC.parse_state(state)
    local pos = natural_position(enc(tie, member))
    if reverse then pos = total - 1 - pos end
    local better
    if high_first then
      better = redis.call('ZCOUNT', RK, '(' .. score, '+inf') + redis.call('ZCOUNT', OV, '(' .. score, '+inf')
    else
      better = redis.call('ZCOUNT', RK, '-inf', '(' .. score) + redis.call('ZCOUNT', OV, '-inf', '(' .. score)
    end
    row[M.STATE], row[M.POSITION], row[M.BETTER] = state, pos, better
    row[M.META] = redis.call('HGET', KEYS[K.META], member) or ''
  end
  for j = 1, M._N do out[#out + 1] = row[j] end
end
return out
