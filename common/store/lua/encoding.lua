-- encoding.lua: the Lua side of common/store/encoding.py (included by apply.lua and locate.lua).
-- C (the prelude) carries the numbers: the exact bound and the tie prefix's width and maximum.
local ENC = {}
local TIE_FORMAT = '%0' .. C.TIE_WIDTH .. 'x'

-- the one text form of a score: integers without a fraction, others round-trip exact
function ENC.score(x)
  if x == math.floor(x) and math.abs(x) <= C.EXACT then return string.format('%d', x) end
  return string.format('%.17g', x)
end

-- a member's state in a state hash: "<score text>|<tie ms>" (common/store/encoding.py parse_state)
function ENC.state(score_text, tie)
  return score_text .. '|' .. ENC.score(tie)
end

-- the score text and the tie ms of a state
function ENC.parse_state(raw)
  local bar = string.find(raw, '|', 1, true)
  return string.sub(raw, 1, bar - 1), tonumber(string.sub(raw, bar + 1))
end

-- the zset member of `member` that reached its score at `tie` ms, for tie mode inv|fwd|none;
-- prefixes are formatted once per tie value per script call
local prefixes = {}
function ENC.member(mode, tie, member)
  if mode == 'none' then return member end
  local p = prefixes[tie]
  if p == nil then
    p = string.format(TIE_FORMAT, mode == 'inv' and C.TIE_MAX - tie or tie)
    prefixes[tie] = p
  end
  return p .. member
end

-- A packed window instance (common/store/packing.py): `bits` of tie time beside an integer
-- score, counted from `base` ms, inverted in tie mode inv. nil for the general layout.
function ENC.packing(bits, base, mode)
  if bits < 0 then return nil end
  return {bits = bits, base = base, scale = 2 ^ bits, inv = mode == 'inv'}
end

-- the tie a packed instance keeps for an event at `tie` ms (0 without tie bits); an event time
-- outside the period would corrupt the order: raise (the worker dead-letters the event)
function ENC.packed_tie(p, tie)
  if p.bits == 0 then return 0 end
  local off = tie - p.base
  if off < 0 or off >= p.scale then error('tie ' .. tie .. ' is outside the packed period from ' .. p.base) end
  return tie
end

-- the zset score of a member of a packed instance
function ENC.pack(p, score, tie)
  if p.bits == 0 then return score end
  local off = tie - p.base
  if p.inv then off = p.scale - 1 - off end
  return score * p.scale + off
end

-- the score and tie of a packed zset score
function ENC.unpack(p, value)
  if p.bits == 0 then return value, 0 end
  local score = math.floor(value / p.scale)
  local off = value - score * p.scale
  if p.inv then off = p.scale - 1 - off end
  return score, p.base + off
end
