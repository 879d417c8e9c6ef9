-- packedpage.lua: one page of a packed window's members for backfill, rank and overflow zsets
--! read-only (run with EVALSHA_RO: a user whose keys are read-only may run it)
-- together, by packed value (common/store/scan.py).
-- KEYS (positions in K): rank zset, overflow zset. ARGV (positions in A): the last packed value
-- of the previous page ('-inf' for the first), the page size.
-- Returns {member_1, value_1, ...}: the members whose packed value is above the previous page's,
-- in value order, at least `size` of them unless fewer remain, and always every member that
-- shares the page's last value (so the next page starts strictly above it). A member that
-- moves between the two zsets (max_members) keeps its value, so paging by value never skips
-- it; one whose value changes was written, and its new state is published live.
local after, size = ARGV[A.AFTER], tonumber(ARGV[A.SIZE])
local low = after == '-inf' and '-inf' or '(' .. after
local rows = {}
for _, key in ipairs({KEYS[K.RANK], KEYS[K.OVERFLOW]}) do
  local got = redis.call('ZRANGE', key, low, '+inf', 'BYSCORE', 'LIMIT', 0, size, 'WITHSCORES')
  for j = 1, #got, 2 do rows[#rows + 1] = {got[j], tonumber(got[j + 1]), got[j + 1]} end
end
if #rows == 0 then return {} end
table.sort(rows, function(a, b) return a[2] < b[2] end)
local last = rows[math.min(size, #rows)]
local out = {}
for _, row in ipairs(rows) do
  if row[2] < last[2] then
    out[#out + 1] = row[1]
    out[#out + 1] = row[3]
  end
end
-- the whole group of the last value, from both zsets (the LIMIT may have cut it)
for _, key in ipairs({KEYS[K.RANK], KEYS[K.OVERFLOW]}) do
  local got = redis.call('ZRANGE', key, last[3], last[3], 'BYSCORE', 'WITHSCORES')
  for j = 1, #got do out[#out + 1] = got[j] end
end
return out
