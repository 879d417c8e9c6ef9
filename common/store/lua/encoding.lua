-- encoding.lua: the Lua side of common/store/encoding.py (included by apply.lua and locate.lua).
-- C (the prelude) carries the numbers: the exact bound and the tie prefix's width and maximum.
local ENC = {}
local TIE_FORMAT = '%0' .. C.TIE_WIDTH .. 'x'

-- the one text form of a score: integers without a fraction, others round-trip exact
function ENC.score(x)
  if x == math.floor(x) and math.abs(x) <= C.EXACT then return string.format('%d', x) end
  return string.format('%.17g', x)
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
