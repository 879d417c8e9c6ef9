-- locate.lua: score, position and "members strictly better" of several members, one round trip.
--! read-only (run with EVALSHA_RO: a user whose keys are read-only may run it)
--! include encoding
--! include xhash
--! include tieindex
--! include page
-- KEYS (positions in K, ARGV in A; common/store/reads.py): rank zset, overflow zset, the
--       previous release's state hash, tie index directory, meta hash, board seq. ARGV: desc
--       1|0, reverse 1|0, tie mode inv|fwd|none, the packing (tie bits, -1 = the general
--       layout; the ms ties count from), around (-1: no page; n: the page of the n rows above
--       and below the first member), the tie prefix's length (for that page), better 1|0 (0:
--       no strictly-better counts, -1 in their place: ordinal ranks need none), then the members.
-- Returns {total, seq, then per member (positions in M): state ('' if absent), position
-- (0-based in the view, -1 if absent), strictly-better count in the view (-1 if absent), meta
-- ('' if none)}; with around >= 0, then the page as top.lua returns it (n = 0: the first
-- member is absent), and its first row's strictly-better count (shared ranks start there).
local desc, reverse, mode = ARGV[A.DESC] == '1', ARGV[A.REVERSE] == '1', ARGV[A.MODE]
local packing = ENC.packing(tonumber(ARGV[A.BITS]), tonumber(ARGV[A.BASE]), mode)
local RK, OV = KEYS[K.RANK], KEYS[K.OVERFLOW]
local R, O = redis.call('ZCARD', RK), redis.call('ZCARD', OV)
local total = R + O
local high_first = desc ~= reverse

local function enc(tie, member) return ENC.member(mode, tie, member) end
-- a general instance finds a member's entry through its tie index, or the state hash the
-- previous release wrote (apply.lua)
local index = not packing and redis.call('EXISTS', KEYS[K.STATE]) == 0 and TI.new(KEYS[K.INDEX], 0, '0')

-- the member's zset member, its score text and its state ("<score>|<tie>"); nil if absent
local function find(member)
  if index then
    local tie = TI.tie(index, member)
    if not tie then return nil end
    local zmember = enc(tie, member)
    local value = redis.call('ZSCORE', RK, zmember) or redis.call('ZSCORE', OV, zmember)
    if not value then return nil end
    local text = ENC.score(tonumber(value))
    return zmember, text, ENC.state(text, tie)
  end
  if not packing then
    local state = redis.call('HGET', KEYS[K.STATE], member)
    if not state then return nil end
    local score, tie = ENC.parse_state(state)
    return enc(tie, member), score, state
  end
  local value = redis.call('ZSCORE', RK, member) or redis.call('ZSCORE', OV, member)
  if not value then return nil end
  local score, tie = ENC.unpack(packing, tonumber(value))
  local text = ENC.score(score)
  return member, text, ENC.state(text, tie)
end

-- ZCOUNT bounds of the members strictly better than `score` (its text)
local function better_bounds(score)
  if packing then
    local s = tonumber(score)
    if high_first then return ENC.score((s + 1) * packing.scale), '+inf' end
    return '-inf', '(' .. ENC.score(s * packing.scale)
  end
  if high_first then return '(' .. score, '+inf' end
  return '-inf', '(' .. score
end

local function natural_position(m)
  local rank = desc and redis.call('ZREVRANK', RK, m) or redis.call('ZRANK', RK, m)
  if rank then return rank end
  rank = desc and redis.call('ZREVRANK', OV, m) or redis.call('ZRANK', OV, m)
  return R + rank
end

local around, want_better = tonumber(ARGV[A.AROUND]), ARGV[A.BETTER] == '1'
local first  -- the first member's position and score text, for the page around it
local out = {total, tonumber(redis.call('GET', KEYS[K.SEQ]) or '0')}
for k = A._N + 1, #ARGV do
  local member = ARGV[k]
  local zmember, score, state = find(member)
  local row = {}
  if not zmember then
    row[M.STATE], row[M.POSITION], row[M.BETTER], row[M.META] = '', -1, -1, ''
  else
    local pos = natural_position(zmember)
    if reverse then pos = total - 1 - pos end
    local better = -1
    if want_better then
      local lo, hi = better_bounds(score)
      better = redis.call('ZCOUNT', RK, lo, hi) + redis.call('ZCOUNT', OV, lo, hi)
    end
    row[M.STATE], row[M.POSITION], row[M.BETTER] = state, pos, better
    row[M.META] = redis.call('HGET', KEYS[K.META], member) or ''
    if k == A._N + 1 then first = {pos, score, better} end
  end
  for j = 1, M._N do out[#out + 1] = row[j] end
end
if around >= 0 then
  local members, scores = {}, {}
  local start = 0
  if first then
    start = math.max(first[1] - around, 0)
    members, scores = PAGE.rows(RK, OV, R, O, start, first[1] + around + 1, high_first, reverse,
      tonumber(ARGV[A.PLEN]))
  end
  PAGE.append(out, members, scores, KEYS[K.META])
  -- shared ranks: members strictly ahead of the page's first row (its zset score, maybe packed)
  local ahead = 0
  if #members > 0 and want_better then
    if start == first[1] then ahead = first[3]
    else
      local lo, hi = better_bounds(packing and ENC.score((ENC.unpack(packing, tonumber(scores[1])))) or scores[1])
      ahead = redis.call('ZCOUNT', RK, lo, hi) + redis.call('ZCOUNT', OV, lo, hi)
    end
  end
  out[#out + 1] = ahead
end
return out
