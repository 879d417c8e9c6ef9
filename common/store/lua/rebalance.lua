-- rebalance.lua: max_members inside a native transaction (common/store/native.py): the rank
-- zset keeps exactly the instance's best members, the rest go to the overflow (overflow.lua).
--! include overflow
-- KEYS: the rank zset, the overflow. ARGV: the header R.
OV.rebalance(KEYS[1], KEYS[2], tonumber(ARGV[R.CHANGED]), tonumber(ARGV[R.MAX]), ARGV[R.DESC] == '1')
return 1
