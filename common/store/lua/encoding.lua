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
