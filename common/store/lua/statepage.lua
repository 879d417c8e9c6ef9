-- statepage.lua: one page of a general window instance's member states for backfill, read
--! read-only (run with EVALSHA_RO: a user whose keys are read-only may run it)
-- through its tie index (common/store/scan.py).
--! include encoding
--! include xhash
--! include tieindex
-- KEYS (positions in K): rank zset, overflow zset, tie index directory. ARGV (positions in A):
-- the walk's cursor (0 to start), the page size, the tie mode.
-- Returns {next cursor (-1: done), member_1, state_1, ...} with states "<score>|<tie ms>": the
-- members of whole index buckets, at least `size` of them unless the walk ends. The index
-- entry and the zset score are read together; a member that moves between the two zsets
-- (max_members) keeps its entry and is read once; one whose tie changes meanwhile was
-- written, and its new state is published live.
local index = TI.new(KEYS[K.INDEX], 0, '0')
local rows, cursor = TI.page(index, tonumber(ARGV[A.CURSOR]), tonumber(ARGV[A.SIZE]))
local out, wanted = {cursor}, {}
for _, row in ipairs(rows) do wanted[#wanted + 1] = ENC.member(ARGV[A.MODE], row[2], row[1]) end
local found = {}
for _, key in ipairs({KEYS[K.RANK], KEYS[K.OVERFLOW]}) do
  if #wanted > 0 then
    local got = redis.call('ZMSCORE', key, unpack(wanted))
    for j, zmember in ipairs(wanted) do
      if got[j] then found[zmember] = got[j] end
    end
  end
end
for j, row in ipairs(rows) do
  local value = found[wanted[j]]
  if value then
    out[#out + 1] = row[1]
    out[#out + 1] = ENC.state(ENC.score(tonumber(value)), row[2])
  end
end
return out
