-- idwindow.lua: the board's id window (included by apply.lua; see common/idwindow.py).
--
-- Remembers each applied event's id fingerprint (10 bytes, computed by the worker) with the
-- second it was applied, for at least the id window, in xhash.lua's buckets (zset fingerprint
-- -> applied-at second; a fingerprint's slot value is its first three bytes).
-- Each write to a bucket first drops its expired entries (the oldest, at the front of the
-- listpack), so a bucket holds only ids still in the window; a bucket that then outgrows the
-- listpack limit splits in two. Every key expires one window after its last insert, so an idle
-- board's window disappears whole.

local IDW = {}

function IDW.new(dir, window_s, cap)
  local function expire(key) redis.call('PEXPIRE', key, (window_s + 1) * 1000) end
  return {x = XH.new(dir, cap, XH.bytes_slot, expire), window = window_s, now = nil, pending = {},
          order = {}, found = {}}
end

local function now_s(w)
  if w.now == nil then w.now = tonumber(redis.call('TIME')[1]) end
  return w.now
end

-- phase 1: read when each of `fps` was applied (one ZMSCORE per bucket)
function IDW.prefetch(w, fps)
  local wanted = {}
  for _, fp in ipairs(fps) do
    if w.found[fp] == nil then
      w.found[fp] = false
      wanted[#wanted + 1] = fp
    end
  end
  local keys, groups = XH.group(w.x, wanted)
  for _, key in ipairs(keys) do
    local g = groups[key].items
    local at = redis.call('ZMSCORE', key, unpack(g))
    for j, fp in ipairs(g) do w.found[fp] = at[j] and tonumber(at[j]) or false end
  end
end

-- was fp applied less than the window ago (or earlier in this call)?
function IDW.seen(w, fp)
  if w.pending[fp] then return true end
  local at = w.found[fp]
  if at == nil then
    at = redis.call('ZSCORE', (XH.bucket(w.x, XH.bytes_slot(fp))), fp)
    at = at and tonumber(at)
  end
  return at ~= false and now_s(w) - at < w.window
end

-- remember fp as applied now, or at second `at` (phase 1: queued; written by IDW.flush)
function IDW.add(w, fp, at)
  if not w.pending[fp] then
    w.pending[fp] = at or true
    w.order[#w.order + 1] = fp
  end
end

-- phase 2: write the queued fingerprints, one ZADD per bucket, splitting what outgrew the cap
function IDW.flush(w)
  if #w.order == 0 then return end
  local x, now = w.x, string.format('%d', now_s(w))
  local keys, groups = XH.group(x, w.order)  -- every bucket before a split changes the directory
  local stale = '(' .. string.format('%d', now_s(w) - w.window + 1)  -- applied a window ago or more
  for _, key in ipairs(keys) do
    local g, args = groups[key], {}
    for _, fp in ipairs(g.items) do
      local at = w.pending[fp]
      args[#args + 1] = at == true and now or string.format('%d', at)
      args[#args + 1] = fp
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', stale)
    local new = redis.call('ZADD', key, unpack(args))
    if XH.settle(x, key, g.d, g.p, new) >= 0 then x.expire(key) end
  end
  if XH.dir_len(x) > 0 then x.expire(x.dir) end
end
