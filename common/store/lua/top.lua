-- top.lua: one page of a board window in one round trip.
--! read-only (run with EVALSHA_RO: a user whose keys are read-only may run it)
--! include page
-- KEYS (positions in K, ARGV in A; common/store/reads.py): rank zset, overflow zset, meta hash,
--       board seq. ARGV: start, stop (exclusive; 0-based positions in the view), desc 1|0 (the
--       board's order), reverse 1|0 (view opposite to it), the tie prefix's length, raw 1|0
--       (1: members keep their tie prefix, as the zsets order them: a sharded board's reads
--       merge its shards' rows by them, common/store/shardreads.py)
-- Returns {total, seq, n, member_1, score_1, ..., member_n, score_n, meta_1 ('' if none), ..., meta_n}.
local start, stop = tonumber(ARGV[A.START]), tonumber(ARGV[A.STOP])
local desc, reverse, plen = ARGV[A.DESC] == '1', ARGV[A.REVERSE] == '1', tonumber(ARGV[A.PLEN])
local RK, OV = KEYS[K.RANK], KEYS[K.OVERFLOW]
local R, O = redis.call('ZCARD', RK), redis.call('ZCARD', OV)
local raw = ARGV[A.RAW] == '1'
local members, scores = PAGE.rows(RK, OV, R, O, start, stop, desc ~= reverse, reverse, raw and 0 or plen)
local out = {R + O, tonumber(redis.call('GET', KEYS[K.SEQ]) or '0')}
PAGE.append(out, members, scores, KEYS[K.META], raw and plen or 0)
return out
