-- periodmark.lua: the state of a period's result (worker/results.py), in its marker
-- KEYS[1] (K.MARK), `<board>:rp:<period>` (common/store/keys.py), which a rolling period's
-- preparation wrote first ("busy:<owner>", then "done"; worker/rolling.py).
-- ARGV (A): op, the period's expiry (ms; the marker goes with it), then for `swap` the marker
-- expected ('' = none) and the one to write.
--   seal: no marker, or a preparation's, becomes "sealed" (apply.lua then leaves the period
--         alone: it is final); any result state stays. Returns the marker after.
--   swap: the marker becomes the new one only if it is the expected one. Returns the marker after.
local mark = redis.call('GET', KEYS[K.MARK])
local expire = ARGV[A.EXPIRE]
if ARGV[A.OP] == 'seal' then
  if not mark or mark == 'done' or string.sub(mark, 1, 5) == 'busy:' then
    mark = 'sealed'
    redis.call('SET', KEYS[K.MARK], mark, 'PXAT', expire)
  end
  return mark
end
if (mark or '') == ARGV[A.EXPECTED] then
  mark = ARGV[A.NEW]
  redis.call('SET', KEYS[K.MARK], mark, 'PXAT', expire)
end
return mark or ''
