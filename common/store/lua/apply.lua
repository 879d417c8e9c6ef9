-- apply.lua: apply a batch of update events of ONE board, atomically and exactly once.
--! include encoding
--! include xhash
--! include idwindow
--! include tieindex
--! include overflow
--
-- KEYS (positions in KEY and INST, from common/store/apply.py): board seq, board meta hash,
--       board fence hash, id window directory,
--       then per window instance i = 1..W: rank zset, overflow zset, the previous release's
--       state hash, tie index directory, reset mark (the seq of its latest reset; ikey below).
-- ARGV (positions in H, SRC, IA and EV): header, then S sources (fence field, topic id, low
--       water), then per instance its expire-at ms (0 = never) and packing (tie bits, -1 = the
--       general layout, and the ms its ties count from), its rolling role and links, whether its
--       result may be sealed, whether it is a league division, then per event F fields: op, member,
--       score, tie ms, meta ('' = none), window mask (bit i-1 set = the event counts in instance i), offset, where
--       (source number * 1000 + array index + 1; 0 = no source), id fingerprint, the member's
--       join order (its tie in a league division: ties there rank by join order), and while
--       adopting a previous release's board the key of its record of the id (common/store/keys.py).
-- `--! phase <name>` lines are comments; bench/redis_phases.py turns them into timers (the
-- time since the previous one is charged to <name>).
-- Returns, per event: status (C.ST; common/store/encoding.py Status), board seq, for FAILED the error
-- class its first delivery raised (op 'x' records that), and when "want state"
-- (hot boards): per instance in its mask, "<score>|<tie ms>" or "" for an absent member, then
-- the member's meta ('' if none), so update_cache always carries it; '~' for a derived rolling
-- period the event did not write (its preparation has not begun): nothing to publish. A board whose fence
-- belongs to another epoch returns {-1, <its epoch>} and changes nothing; so does {-1, ''} a board
-- without a fence whose slot has no mark (common/store/slotmarks.py: the slot lost its data).
-- {-2, 0 | 1}: the board's registration by an API node (KEY.PROMOTED exists) is not what
-- H.PROMOTED says: nothing changed, the worker calls again knowing it.
--
-- Control ops (`rankstream erase` / `reset`, common/control.py) come alone in their call and
-- count in every instance of it, whatever their mask says (a double: it can't name more than 53,
-- and an erase reaches every period that may hold data). `erase` is a delete in every instance,
-- meta included. `reset` (its member is a selector: '*' = the whole board) empties every instance
-- of the call, tie index and all, and for the whole board its meta; it is decided like any event
-- (fence, id window), and its "state" per instance is the seq of the instance's latest reset,
-- this one's or, for a redelivery, the one its reset mark remembers (which expires with it).
--
-- Exactly once: the fence keeps, per source (topic, partition), the topic id and the last
-- (offset, where) applied, and the positions of events the script rejected since the source's
-- low water (the worker's last committed offset). An event at or before the fence changes
-- nothing and reports what its first delivery reported. A new event whose id fingerprint was
-- applied less than the id window ago is a producer duplicate.
--
-- The zset score is the exact score; the member is prefixed with its tie time in fixed-width
-- hex (common/store/encoding.py) so Redis' bytewise order of equal scores is the tie rule; the
-- tie index (tieindex.lua) finds a member's entry. An instance with a state hash (member ->
-- "<score>|<tie ms>", as releases before the tie index wrote) keeps it in place of the index.
-- A packed instance (common/store/packing.py) instead keeps the member's own id with the tie
-- inside its integer score, and has neither: its zsets are the state.
--
-- Rolling windows (IA.ROLE; common/store/apply.py Rolling, worker/rolling_slots.py): a BUCKET
-- ('b') is a hash member -> "<value>|<latest event ms>" (its STATE key), the member's board over
-- that bucket's events alone (incr adds, set overwrites, best keeps the better); an event's delta
-- in its window is its bucket's value after minus before. A DELTA ('d') period adds that delta
-- (general layout; its tie is the member's latest event). A DERIVED ('f') period q+1, prepared
-- ahead, is written absolute: R[q] - B[q-N+1] + B[q+1] from the call's instances FROM, OLD and
-- NEW, the member kept from R[q] only if its latest event there is at or after KEEP, and only once
-- its preparation began (its INST.PREP marker exists: before that the preparer's walk of R[q],
-- which comes after, derives every member, so events spare the write). Op `derive`
-- (worker/rolling.py) writes just that for one member, outside the fence, the id window and seq;
-- op `rebuild` instead sums the member's values in every bucket of the call (catching up a period
-- whose preparation nobody ran: then the period before it can lack late events).
-- A delete or erase empties the member's every instance of its call (the worker sends a delete on
-- a board with rolling windows as an erase alone in its call, holding all the window's buckets).

-- H (ARGV header positions) and C (shared constants, statuses C.ST) come from the prelude
-- that common/store/scripts.py generates; common/store/apply.py is the only caller.
local W, E = tonumber(ARGV[H.W]), tonumber(ARGV[H.E])
local mode, desc, maxm = ARGV[H.MODE], ARGV[H.DESC] == '1', tonumber(ARGV[H.MAXM])
local want_state, epoch = ARGV[H.STATE] == '1', ARGV[H.EPOCH]
local legacy_ttl, S = ARGV[H.LEGACY_TTL], tonumber(ARGV[H.S])
local legacy = legacy_ttl ~= '0'
-- a declared score range (integers only) or +-EXACT; a result outside it refuses the event
local low, high, integral = tonumber(ARGV[H.LOW]), tonumber(ARGV[H.HIGH]), ARGV[H.INTEGRAL] == '1'
local F = legacy and EV._N or EV._N - 1  -- ARGV per event: EV.LEGACY_KEY only while adopting
local ST = C.ST
local KI = KEY._N  -- KEYS before the instances
-- the key of instance i's rank (INST.RANK), overflow (INST.OVERFLOW), state hash (INST.STATE)
-- or tie index (INST.INDEX)
local function ikey(i, which) return KEYS[KI + INST._N * (i - 1) + which] end
local fmt = ENC.score
local function enc(tie, member) return ENC.member(mode, tie, member) end

local function better(a, b)
  if desc then return a > b end
  return a < b
end

local SLICE = OV.SLICE

-- Per call, each (instance, member) is read from Redis once, before any decision (one HMGET
-- per instance), and written once, after the last (one ZREM/ZADD/HSET/HDEL per instance): a
-- burst of events from one member costs one write. c.rtie = the tie of the entry in Redis.
local cache = {}
local function load(i, member)
  return cache[i][member]
end
local packings = {}  -- instance -> ENC.packing (nil: the general layout), read with the ARGV
local roles, groups, from_, old_, new_, keep_ = {}, {}, {}, {}, {}, {}  -- rolling (IA.ROLE...)
-- instance -> true: a league division (common/league.py), whose ties are members' join order
-- (each event's EV.JOIN) instead of event times; it keeps no tie index: a member's entry is
-- their id under their join order, which `joins` holds per member from the events
local joined, joins = {}, {}
local started = {}  -- derived instance -> its preparation began
local bucket_list = {}  -- the call's rolling buckets (op rebuild sums them)
local indexes = {}  -- instance -> its tie index (TI.new); false: it keeps a state hash (or is packed)

-- the zset scores of instance i's entries `zmembers` (by position; nil: in neither zset): one
-- ZMSCORE on the rank zset, then (max_members) one on the overflow for the entries it lacks
local function zscores(i, zmembers)
  local scores, pending = {}, {}
  for j = 1, #zmembers do pending[j] = j end
  for _, which in ipairs(maxm > 0 and {INST.RANK, INST.OVERFLOW} or {INST.RANK}) do
    if #pending == 0 then break end
    local args, missing = {}, {}
    for k, j in ipairs(pending) do args[k] = zmembers[j] end
    local got = redis.call('ZMSCORE', ikey(i, which), unpack(args))
    for k, j in ipairs(pending) do
      if got[k] then scores[j] = tonumber(got[k]) else missing[#missing + 1] = j end
    end
    pending = missing
  end
  return scores
end

-- a packed instance holds its members under their own ids: their packed scores are the state
local function prefetch_packed(i, p, members)
  local ci, scores = cache[i], zscores(i, members)
  for j, member in ipairs(members) do
    if scores[j] then
      local score, t = ENC.unpack(p, scores[j])
      ci[member] = {present = true, score = score, tie = t, rtie = t}
    else
      ci[member] = {present = false}
    end
  end
end

-- a general instance: the tie index gives each member's zset entry. An entry the index names
-- but neither zset holds is treated as absent (c.rtie still set: writing the member drops or
-- replaces it).
local function prefetch_indexed(i, members)
  local ci, ties, wanted, zmembers = cache[i], TI.ties(indexes[i], members), {}, {}
  for _, member in ipairs(members) do
    local t = ties[member]
    if t then
      wanted[#wanted + 1] = member
      zmembers[#zmembers + 1] = enc(t, member)
    end
    ci[member] = {present = false, rtie = t or nil}
  end
  local scores = zscores(i, zmembers)
  for j, member in ipairs(wanted) do
    if scores[j] then
      local c = ci[member]
      c.present, c.score, c.tie = true, scores[j], c.rtie
    end
  end
end

-- a league division: each member's entry is their id under their join order. An erase carries
-- none (it reaches the member's every division): its member is found among the division's
-- entries (at most its division_size)
local function prefetch_joined(i, members)
  local ci, zmembers, wanted, unknown = cache[i], {}, {}, {}
  for _, member in ipairs(members) do
    ci[member] = {present = false}
    local j = joins[i][member]
    if j then
      wanted[#wanted + 1] = member
      zmembers[#zmembers + 1] = enc(j, member)
    else
      unknown[member] = true
    end
  end
  local scores = zscores(i, zmembers)
  for k, member in ipairs(wanted) do
    local j = joins[i][member]
    if scores[k] then ci[member] = {present = true, score = scores[k], tie = j, rtie = j} end
  end
  if next(unknown) == nil then return end
  local rows = redis.call('ZRANGE', ikey(i, INST.RANK), 0, -1, 'WITHSCORES')
  for k = 1, #rows, 2 do
    local member = string.sub(rows[k], C.TIE_WIDTH + 1)
    if unknown[member] then
      local t = tonumber(string.sub(rows[k], 1, C.TIE_WIDTH), 16)
      if mode == 'inv' then t = C.TIE_MAX - t end
      ci[member] = {present = true, score = tonumber(rows[k + 1]), tie = t, rtie = t}
    end
  end
end

local function prefetch(i, members)
  local ci = {}
  cache[i] = ci
  if #members == 0 then return end
  if packings[i] then return prefetch_packed(i, packings[i], members) end
  if joined[i] then return prefetch_joined(i, members) end
  if indexes[i] then return prefetch_indexed(i, members) end
  local got = redis.call('HMGET', ikey(i, INST.STATE), unpack(members))
  for j, member in ipairs(members) do
    local old = got[j]
    if old then
      local score, t = ENC.parse_state(old)
      ci[member] = {present = true, score = tonumber(score), tie = t, rtie = t}
    else
      ci[member] = {present = false}
    end
  end
end

-- the planned new score of one member in one instance: nil = unchanged, false = delete
local function plan(c, op, score)
  if op == 'delete' or op == 'erase' then
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

-- the zset writes of one instance's dirty members: removals from the rank zset and from the
-- overflow, then additions (ZADD moves a member the rank zset holds), then the max_members split
local function write_zsets(i, rem, gone, add, changed)
  local rk, ov = ikey(i, INST.RANK), ikey(i, INST.OVERFLOW)
  if #rem > 0 then redis.call('ZREM', rk, unpack(rem)) end
  if maxm > 0 and #gone > 0 then redis.call('ZREM', ov, unpack(gone)) end
  if #add > 0 then redis.call('ZADD', rk, unpack(add)) end
  if maxm > 0 then OV.rebalance(rk, ov, changed, maxm, desc) end
end

-- a packed instance: the member's own id, its packed score; no state hash
local function flush_packed(i, p, list)
  local rem, gone, add = {}, {}, {}
  for _, d in ipairs(list) do
    local member, c = d[1], d[2]
    if c.rtie then gone[#gone + 1] = member end  -- the overflow may hold it
    if c.present then
      add[#add + 1] = fmt(ENC.pack(p, c.score, c.tie))
      add[#add + 1] = member
    else
      rem[#rem + 1] = member
    end
  end
  write_zsets(i, rem, gone, add, #list)
end

-- a rolling bucket: its hash alone
local function flush_bucket(i, list)
  local hset, hdel = {}, {}
  for _, d in ipairs(list) do
    local member, c = d[1], d[2]
    if c.present then
      hset[#hset + 1] = member
      hset[#hset + 1] = ENC.state(fmt(c.score), c.tie)
    else
      hdel[#hdel + 1] = member
    end
  end
  local st = ikey(i, INST.STATE)
  if #hset > 0 then redis.call('HSET', st, unpack(hset)) end
  if #hdel > 0 then redis.call('HDEL', st, unpack(hdel)) end
end

-- phase 2 for one instance: its dirty members, written with one call per command
local function flush(i, list)
  if roles[i] == 'b' then return flush_bucket(i, list) end
  if packings[i] then return flush_packed(i, packings[i], list) end
  local index, plain = indexes[i], joined[i]  -- plain: a league division's zsets alone
  local rem, gone, add = {}, {}, {}
  local hset, hdel, put, drop = {}, {}, {}, {}  -- the state hash's writes, or the tie index's
  for _, d in ipairs(list) do
    local member, c = d[1], d[2]
    if c.rtie then
      local old = enc(c.rtie, member)
      -- a member that stays with the same tie (or has no tie prefix) keeps its zset entry, whose
      -- score ZADD overwrites
      if not (c.present and (mode == 'none' or c.tie == c.rtie)) then rem[#rem + 1] = old end
      gone[#gone + 1] = old  -- the overflow may hold it (in mode none under its plain name)
    end
    if c.present then
      local text = fmt(c.score)
      add[#add + 1] = text
      add[#add + 1] = enc(c.tie, member)
      if plain then
        -- nothing else: the entry is all a division keeps
      elseif not index then
        hset[#hset + 1] = member
        hset[#hset + 1] = ENC.state(text, c.tie)
      elseif c.tie ~= c.rtie then
        put[#put + 1] = {member, c.tie}  -- the index changes only where the tie does
      end
    elseif not index and not plain then
      hdel[#hdel + 1] = member
    elseif c.rtie and not plain then
      drop[#drop + 1] = member
    end
  end
  if index then TI.write(index, put, drop) end
  local st = ikey(i, INST.STATE)
  if #hset > 0 then redis.call('HSET', st, unpack(hset)) end
  if #hdel > 0 then redis.call('HDEL', st, unpack(hdel)) end
  write_zsets(i, rem, gone, add, #list)
end

-- Two phases: every read and decision first, every write after the last event is decided. A
-- script that raises midway has then written nothing, so the worker can narrow a failed call
-- down to its event by re-applying one event at a time (worker/apply.py) without losing or
-- double-counting anything.
local metas = {}  -- member -> meta after this call's events ('' = none); read in phase 1

-- the fence: per source its stored position and the positions rejected since the low water
-- (positions as exact integer text: Lua's own number-to-text turns 10^14 into '1e+14')
local function pos_key(offset, sub) return string.format('%d:%d', offset, sub) end
local sources, fields = {}, {'e'}
local at = H._N  -- the header, then the sources
for k = 1, S do
  local src = {field = ARGV[at + SRC.FIELD], topic = ARGV[at + SRC.TOPIC], low = tonumber(ARGV[at + SRC.LOW]),
               rejected = {}}
  at = at + SRC._N
  sources[k] = src
  fields[#fields + 1] = src.field
  fields[#fields + 1] = src.field .. '!r'
end
local stored = redis.call('HMGET', KEYS[KEY.FENCE], unpack(fields))
if stored[1] and stored[1] ~= epoch then return {-1, stored[1]} end
-- no fence: a new board, or (a cluster) one whose slot lost its data, as its slot's mark did
if not stored[1] and ARGV[H.MARKED] == '1' and redis.call('EXISTS', KEYS[KEY.SLOT]) == 0 then
  return {-1, ''}
end
-- an API node registered the board (or its registration lapsed) since the worker last knew:
-- nothing is written, the worker learns it and calls again (with want_state while registered)
local promoted = redis.call('EXISTS', KEYS[KEY.PROMOTED])
if promoted ~= (ARGV[H.PROMOTED] == '1' and 1 or 0) then return {-2, promoted} end
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
local expires, any_rolling, sealed, any_sealed, sealable = {}, false, {}, false, false
for i = 1, W do
  expires[i] = ARGV[at + IA.EXPIRE]
  packings[i] = ENC.packing(tonumber(ARGV[at + IA.BITS]), tonumber(ARGV[at + IA.BASE]), mode)
  roles[i], groups[i] = ARGV[at + IA.ROLE], ARGV[at + IA.GROUP]
  from_[i], old_[i], new_[i] = tonumber(ARGV[at + IA.FROM]), tonumber(ARGV[at + IA.OLD]), tonumber(ARGV[at + IA.NEW])
  keep_[i] = tonumber(ARGV[at + IA.KEEP])
  joined[i] = ARGV[at + IA.JOIN] == '1'
  if roles[i] ~= 'z' then any_rolling = true end
  if roles[i] == 'f' then started[i] = redis.call('EXISTS', ikey(i, INST.PREP)) == 1 end
  if roles[i] == 'b' then bucket_list[#bucket_list + 1] = i end
  -- a period whose result is sealed (sealed, sending or sent: worker/results.py) is
  -- final: events the worker's clock still lets in (within the late grace) no longer change it
  if ARGV[at + IA.SEAL] == '1' then
    sealable = true
    local mark = redis.call('GET', ikey(i, INST.PREP))
    sealed[i] = mark and string.byte(mark, 1) == 115 or false  -- 's'
    if sealed[i] then any_sealed = true end
  end
  at = at + IA._N
  -- A general instance keeps a tie index unless it has a state hash. A new one (no rank zset
  -- yet) gets a state hash instead while the caller says so (H.INDEX '0': workers of a release
  -- that reads only state hashes may still be running).
  joins[i] = {}
  if roles[i] == 'b' or joined[i] then
    indexes[i] = false  -- a bucket is its hash; a division, its zsets
  elseif not packings[i] and redis.call('EXISTS', ikey(i, INST.STATE)) == 0
     and (ARGV[H.INDEX] == '1' or redis.call('EXISTS', ikey(i, INST.RANK)) == 1) then
    local index = TI.new(ikey(i, INST.INDEX), tonumber(ARGV[H.CAP]), expires[i])
    indexes[i] = index
    -- a period whose expiry moved (its window's retention was changed): the index's keys move
    -- with it, as the zsets do at the end of every call (which keeps the rank zset's current)
    if expires[i] ~= '0' then
      local current = redis.call('PEXPIRETIME', ikey(i, INST.RANK))
      if current > 0 and current ~= tonumber(expires[i]) then TI.restamp(index) end
    end
  else
    indexes[i] = false
  end
end

local ids = IDW.new(KEYS[KEY.IDW], tonumber(ARGV[H.WINDOW]), tonumber(ARGV[H.CAP]))
local legacy_new = {}

-- the events, then phase 1's reads: every member's state in every instance it counts in (one
-- HMGET per instance), the id window's record of every fingerprint, the metas of a hot board
local events, per_instance, seen_in, fps = {}, {}, {}, {}
local members, seen = {}, {}  -- every member of the call's events (their metas, for hot boards)
for i = 1, W do per_instance[i], seen_in[i] = {}, {} end
for e = 1, E do
  local ev = {op = ARGV[at + EV.OP], member = ARGV[at + EV.MEMBER], score = tonumber(ARGV[at + EV.SCORE]),
              tie = tonumber(ARGV[at + EV.TIE_MS]), meta = ARGV[at + EV.META], mask = tonumber(ARGV[at + EV.MASK]),
              offset = tonumber(ARGV[at + EV.OFFSET]), where = tonumber(ARGV[at + EV.WHERE]),
              fp = ARGV[at + EV.FINGERPRINT], join = tonumber(ARGV[at + EV.JOIN]),
              legacy_key = legacy and ARGV[at + EV.LEGACY_KEY] or nil}  -- the previous release's record of the id
  at = at + F
  events[e] = ev
  local inst, mask = {}, ev.mask  -- the instances the event counts in, from its mask
  if ev.op == 'erase' or ev.op == 'reset' then  -- a control op: every instance of its call
    if E > 1 then error('an erase or reset must be alone in its call') end
    for i = 1, W do inst[i] = i end
  else
    for i = 1, W do
      if mask % 2 == 1 then inst[#inst + 1] = i end
      mask = math.floor(mask / 2)
    end
  end
  ev.inst = inst
  -- decided in this order: buckets (the delta), the rest, derived periods (which read both)
  local order = inst
  if any_rolling then
    order = {}
    for pass = 1, 3 do
      for _, i in ipairs(inst) do
        local r = roles[i]
        if (pass == 1 and r == 'b') or (pass == 2 and r ~= 'b' and r ~= 'f') or (pass == 3 and r == 'f') then
          order[#order + 1] = i
        end
      end
    end
  end
  if any_sealed then
    local open = {}
    for _, i in ipairs(order) do if not sealed[i] then open[#open + 1] = i end end
    order = open
  end
  ev.order = order
  local preparing = ev.op == 'derive' or ev.op == 'rebuild' or ev.op == 'restore'
  if ev.op ~= 'x' and not preparing then fps[#fps + 1] = ev.fp end
  if ev.op ~= 'x' and ev.op ~= 'reset' and ev.member ~= '' then  -- a reset reads no member
    if not seen[ev.member] then
      seen[ev.member] = true
      members[#members + 1] = ev.member
    end
    local function wants(i)
      if i > 0 and joined[i] and ev.op ~= 'erase' then joins[i][ev.member] = ev.join end
      if i > 0 and not seen_in[i][ev.member] then
        seen_in[i][ev.member] = true
        per_instance[i][#per_instance[i] + 1] = ev.member
      end
    end
    for _, i in ipairs(inst) do
      if sealed[i] then  -- not written; read for a hot board, which re-publishes its final state
        if want_state then wants(i) end
      elseif roles[i] ~= 'f' then
        wants(i)
      elseif ev.op == 'rebuild' then
        wants(i)
        for _, b in ipairs(bucket_list) do wants(b) end
      elseif started[i] or preparing then  -- not written before its preparation began: not read
        wants(i); wants(from_[i]); wants(old_[i]); wants(new_[i])
      end
    end
  end
end
-- A board whose type no longer has max_members: what its overflow zsets still hold rejoins the
-- ranking before anything is read (the same members, the same scores: no state changes, so doing
-- it before the decisions is safe even if the call fails later). One EXISTS while there is none.
if maxm == 0 and W > 0 then
  local overflows, found = {}, 0
  for i = 1, W do overflows[i] = ikey(i, INST.OVERFLOW) end
  for k = 1, W, SLICE do  -- an erase's call may hold more instances than unpack takes
    found = found + redis.call('EXISTS', unpack(overflows, k, math.min(k + SLICE - 1, W)))
  end
  if found > 0 then
    for i = 1, W do
      local rows = OV.edge(overflows[i], SLICE, true, desc)
      while #rows > 0 do
        OV.move(overflows[i], ikey(i, INST.RANK), rows)
        rows = OV.edge(overflows[i], SLICE, true, desc)
      end
    end
  end
end
--! phase parse
for i = 1, W do prefetch(i, per_instance[i]) end
--! phase read_instances
IDW.prefetch(ids, fps)
if want_state and #members > 0 then
  local got = redis.call('HMGET', KEYS[KEY.META], unpack(members))
  for j, member in ipairs(members) do metas[member] = got[j] or '' end
end
--! phase read_ids_metas

local out, touched, dirty, meta_dirty = {}, {}, {}, {}
local ABSENT = {present = false}

-- A rolling bucket's new state for an event ({score, tie}; nil = unchanged), and the event's
-- delta in its window: the bucket's value after minus before
local function plan_bucket(c, op, score, tie)
  local old = c.present and c.score or 0
  local v
  if op == 'incr' then v = old + score
  elseif op == 'set' or not c.present or better(score, c.score) then v = score
  else v = c.score end  -- best, not better
  local t = c.present and math.max(c.tie, tie) or tie
  if c.present and v == c.score and t == c.tie then return nil, 0 end
  return {v, t}, v - old
end

-- a rolling period's new state when the event adds `delta` to it; its tie is the latest event
local function plan_delta(c, delta, tie)
  local v, t = (c.present and c.score or 0) + delta, c.present and math.max(c.tie, tie) or tie
  if c.present and v == c.score and t == c.tie then return nil end
  return {v, t}
end

-- a member's state in instance i after this event's planned changes (`post`), or before them
local function view(post, i, member)
  if i == 0 then return ABSENT end
  return post[i] or load(i, member)
end

-- a derived period's state of a member after this event: R[q] - B[q-N+1] + B[q+1], kept from
-- R[q] only if its latest event there is at or after KEEP
local function plan_derived(i, c, post, member)
  local r, n = view(post, from_[i], member), view(post, new_[i], member)
  local keep = r.present and r.tie >= keep_[i]
  if not (keep or n.present) then
    if c.present then return false end
    return nil
  end
  local v, t = 0, -1
  if keep then
    local o = view(post, old_[i], member)
    v, t = r.score - (o.present and o.score or 0), r.tie
  end
  if n.present then v, t = v + n.score, math.max(t, n.tie) end
  if c.present and v == c.score and t == c.tie then return nil end
  return {v, t}
end

-- a rebuilt period's state of a member: the sum of its values in the call's buckets
local function plan_sum(c, post, member)
  local v, t, present = 0, -1, false
  for _, b in ipairs(bucket_list) do
    local got = view(post, b, member)
    if got.present then
      v, present = v + got.score, true
      if got.tie > t then t = got.tie end
    end
  end
  if not present then
    if c.present then return false end
    return nil
  end
  if c.present and v == c.score and t == c.tie then return nil end
  return {v, t}
end

-- Plan the event in every instance it counts in before changing any (an out-of-range result
-- changes nothing: false), then change the cache. `derive` plans its derived periods alone.
local function decide(ev, member, op, score, tie)
  local plans, post, delta, in_range = {}, {}, {}, true
  local gone = op == 'delete' or op == 'erase'
  for k, i in ipairs(ev.order) do
    local c, role, new = load(i, member), roles[i], nil
    if gone and role ~= 'f' then
      if c.present then new = false end
    elseif op == 'restore' then  -- the member's state as another board held it, tie and all
      new = {score, packings[i] and role == 'z' and ENC.packed_tie(packings[i], tie) or tie}
    elseif role == 'b' then
      new, delta[groups[i]] = plan_bucket(c, op, score, tie)
    elseif role == 'd' then
      new = plan_delta(c, delta[groups[i]], tie)
    elseif role == 'f' then
      if op == 'rebuild' then new = plan_sum(c, post, member)
      elseif started[i] or op == 'derive' then new = plan_derived(i, c, post, member) end
    else
      local v = plan(c, op, score)
      if v then
        new = {v, packings[i] and ENC.packed_tie(packings[i], tie) or (joined[i] and ev.join or tie)}
      else new = v end
    end
    if new then
      local v = new[1]
      -- a rolling period's score is a sum of buckets: the range holds for each bucket's value
      if (role == 'z' or role == 'b') and (v < low or v > high or (integral and v ~= math.floor(v))) then
        in_range = false
      end
      post[i] = {present = true, score = v, tie = new[2]}
    elseif new == false then
      post[i] = ABSENT
    end
    plans[k] = {i, new, c}
  end
  if not in_range then return false end
  for _, p in ipairs(plans) do
    local i, new, c = p[1], p[2], p[3]
    if new ~= nil then
      if new == false then c.present = false
      else c.present, c.score, c.tie = true, new[1], new[2] end
      if not c.dirty then
        c.dirty = true
        dirty[i][#dirty[i] + 1] = {member, c}
      end
      touched[i] = true
    end
  end
  return true
end
local reset  -- an applied reset: {whole = the whole board?, seq = its seq}
for i = 1, W do dirty[i] = {} end
local seq0 = tonumber(redis.call('GET', KEYS[KEY.SEQ]) or '0')
local seq = seq0
for _, ev in ipairs(events) do
  local op, member, score, tie, meta, inst = ev.op, ev.member, ev.score, ev.tie, ev.meta, ev.inst
  local offset, where, fp, legacy_key = ev.offset, ev.where, ev.fp, ev.legacy_key
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
  elseif op == 'derive' or op == 'rebuild' then
    -- a member of a rolling period prepared ahead (or caught up): no event, so no fence, id or seq
    status = ST.APPLIED
    decide(ev, member, op, score, tie)
  elseif op == 'restore' then
    -- `rankstream reshard-board`: a member's state in the instances of its mask, and/or an id
    -- the id window remembers since `tie` (a second); no event, so no fence or seq
    status = ST.APPLIED
    if member ~= '' then decide(ev, member, op, score, tie) end
    if fp ~= '' then IDW.add(ids, fp, tie) end
  elseif IDW.seen(ids, fp) or (legacy and (legacy_new[legacy_key] or redis.call('EXISTS', legacy_key) == 1)) then
    status = ST.DUPLICATE  -- a duplicate of an applied event is a duplicate, whatever it would do now
  elseif op == 'closed' then
    -- its board's activity ended (worker/apply.py): refused, and remembered so a redelivery is
    -- refused again whatever the clock says then (a redelivery of one applied before the end is
    -- fenced above, a producer retry of one a duplicate, and both report today's state)
    status, failed_as = ST.FAILED, 'board_closed'
    if src then src.rejected[pos_key(offset, sub)] = failed_as end
  elseif op == 'reset' then
    -- applied now, done in phase 2 (the call's instances are what it empties)
    status = ST.APPLIED
    IDW.add(ids, fp)
    if legacy then legacy_new[legacy_key] = true end
    seq = seq + 1
    reset = {whole = member == '*', seq = seq}
  else
    if not decide(ev, member, op, score, tie) then
      status = ST.OUT_OF_RANGE
      if src then src.rejected[pos_key(offset, sub)] = '' end
    else
      status = ST.APPLIED
      IDW.add(ids, fp)
      if legacy then legacy_new[legacy_key] = true end
      seq = seq + 1
      local gone = op == 'delete' or op == 'erase'
      if gone or meta ~= '' then
        metas[member] = gone and '' or meta
        meta_dirty[member] = true
      end
    end
  end
  if src and not fenced then src.offset, src.where, src.changed = offset, sub, true end
  out[#out + 1] = status
  out[#out + 1] = seq
  if status == ST.FAILED then out[#out + 1] = failed_as end
  if sealable then  -- how many sealed instances the applied event skipped: late, to the worker
    local skipped = 0
    if status == ST.APPLIED and any_sealed then
      for _, i in ipairs(inst) do if sealed[i] then skipped = skipped + 1 end end
    end
    out[#out + 1] = skipped
  end
  if want_state then
    for _, i in ipairs(inst) do
      if op == 'reset' then  -- the seq of the instance's latest reset ('': none remembered)
        out[#out + 1] = reset and reset.seq or redis.call('GET', ikey(i, INST.RESET)) or ''
      else
        -- (a sealed period reports its final state: a redelivery re-publishes what its first
        -- delivery may not have, and a late event publishes the state unchanged)
        if roles[i] == 'f' and not started[i] and op ~= 'derive' and op ~= 'rebuild' then
          -- a next period this event did not write: the preparer's walk publishes the member,
          -- with the same seq; a record from here could arrive after it and undo it
          out[#out + 1] = '~'
        else
          local c = load(i, member)
          out[#out + 1] = c.present and ENC.state(fmt(c.score), c.tie) or ''
        end
      end
    end
    out[#out + 1] = metas[member] or ''
  end
end

--! phase decide
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
      redis.call('HDEL', KEYS[KEY.FENCE], src.field .. '!r')
    end
  end
end
if #fence_args > 0 then
  if fence_dirty then fence_args[#fence_args + 1] = 'e'; fence_args[#fence_args + 1] = epoch end
  redis.call('HSET', KEYS[KEY.FENCE], unpack(fence_args))
end
local meta_set, meta_del = {}, {}
for member in pairs(meta_dirty) do
  local m = metas[member]
  if m == '' then meta_del[#meta_del + 1] = member
  else meta_set[#meta_set + 1] = member; meta_set[#meta_set + 1] = m end
end
if #meta_set > 0 then redis.call('HSET', KEYS[KEY.META], unpack(meta_set)) end
if #meta_del > 0 then redis.call('HDEL', KEYS[KEY.META], unpack(meta_del)) end
--! phase write_ids_fence_metas
for i = 1, W do
  if #dirty[i] > 0 then flush(i, dirty[i]) end
end
-- an applied reset: its instances' keys go (their tie index's every bucket too), a whole
-- board's meta with them; each instance's reset mark remembers its seq until the period expires
if reset then
  if reset.whole then redis.call('DEL', KEYS[KEY.META]) end
  for i = 1, W do
    TI.destroy(TI.new(ikey(i, INST.INDEX), tonumber(ARGV[H.CAP]), '0'))
    redis.call('DEL', ikey(i, INST.RANK), ikey(i, INST.OVERFLOW), ikey(i, INST.STATE))
    if roles[i] == 'b' then  -- a bucket is no window: nothing to re-publish
    elseif expires[i] == '0' then redis.call('SET', ikey(i, INST.RESET), reset.seq)
    else redis.call('SET', ikey(i, INST.RESET), reset.seq, 'PXAT', expires[i]) end
  end
end
if seq ~= seq0 then redis.call('SET', KEYS[KEY.SEQ], seq) end
--! phase write_instances

-- a period's keys expire with it (a tie index's as they are written: tieindex.lua); without
-- max_members no instance has an overflow zset (each PEXPIREAT is a call: ~1.5 us)
for i = 1, W do
  local expire_at = expires[i]
  if touched[i] and expire_at ~= '0' and roles[i] == 'b' then
    redis.call('PEXPIREAT', ikey(i, INST.STATE), expire_at)
  elseif touched[i] and expire_at ~= '0' then
    redis.call('PEXPIREAT', ikey(i, INST.RANK), expire_at)
    if maxm > 0 then redis.call('PEXPIREAT', ikey(i, INST.OVERFLOW), expire_at) end
    if not packings[i] and not indexes[i] then redis.call('PEXPIREAT', ikey(i, INST.STATE), expire_at) end
  end
end
--! phase expire
-- last, so a refused PUBLISH (an ACL without the channel) can leave nothing half done: the API
-- nodes' warm caches drop the board (api/warm.py), told in the same script as the writes
if seq ~= seq0 or next(touched) ~= nil then
  redis.call('PUBLISH', ARGV[H.NOTIFY], seq0 .. ' ' .. seq .. ' ' .. ARGV[H.BOARD])
end
--! phase notify
return out
