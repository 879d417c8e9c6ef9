-- promote.lua: an API node's registration of a board it serves from memory (BoardKeys.promoted;
-- worker/promotions.py says what workers do while it exists).
-- KEYS[K.PROMOTED]; ARGV (A): the token of a new registration, its TTL ms (Redis' clock).
-- A registration that exists is kept alive (its TTL set again), whoever started it; else a new
-- one starts with the token given. Returns the registration's token: one other than the token a
-- node loaded the board under means its registration lapsed meanwhile (writes made then were not
-- published), so the node loads the board again.
local token = redis.call('GET', KEYS[K.PROMOTED])
if token then
  redis.call('PEXPIRE', KEYS[K.PROMOTED], ARGV[A.TTL])
  return token
end
redis.call('SET', KEYS[K.PROMOTED], ARGV[A.TOKEN], 'PX', ARGV[A.TTL])
return ARGV[A.TOKEN]
