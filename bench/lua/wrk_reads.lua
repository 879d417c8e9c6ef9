-- wrk_reads.lua: a wrk script (wrk -s, bench/api): the reads of a board spread over its members.
--
-- init() builds a pool of requests, each for a random member (or a random offset, or a set
-- of distinct random members), math.random seeded, every one formatted once; request() returns
-- a random one of the pool, so wrk spends next to nothing per request in Lua.
--
-- args (after `--`): kind board members seed pool_size [lookup_size]
--   members: the board's members are u0000000 .. u<members - 1>, 7 digits
--   kind member: GET /v1/boards/<board>/members/<m>?nocache=1
--        around: GET .../members/<m>/around?n=5&nocache=1
--        top:    GET .../top?limit=10&offset=<0 .. members - 10>&nocache=1
--        lookup: POST .../members/lookup?nocache=1, {"members": [lookup_size distinct ids]}
-- Prints `wrk-info KEY VALUE` lines for the bench to check: the pool's size, its distinct
-- keys (members or offsets) and its first request line.

local pool = {}
local size = 0

local function id(i)
  return string.format("u%07d", i)
end

local function lookup_body(members, n, seen)
  local ids, picked = {}, {}
  while #ids < n do
    local i = math.random(0, members - 1)
    if not picked[i] then
      picked[i] = true
      seen[i] = true
      ids[#ids + 1] = '"' .. id(i) .. '"'
    end
  end
  return '{"members":[' .. table.concat(ids, ",") .. ']}'
end

local function one(kind, base, members, seen, lookup_n)
  if kind == "lookup" then
    local headers = { Host = wrk.headers["Host"], ["Content-Type"] = "application/json" }
    return wrk.format("POST", base .. "/members/lookup?nocache=1", headers, lookup_body(members, lookup_n, seen))
  end
  local path
  local i
  if kind == "top" then
    i = math.random(0, members - 10)
    path = base .. "/top?limit=10&offset=" .. i .. "&nocache=1"
  else
    i = math.random(0, members - 1)
    if kind == "member" then
      path = base .. "/members/" .. id(i) .. "?nocache=1"
    elseif kind == "around" then
      path = base .. "/members/" .. id(i) .. "/around?n=5&nocache=1"
    else
      error("wrk_reads.lua: unknown kind " .. tostring(kind))
    end
  end
  seen[i] = true
  return wrk.format("GET", path)
end

function init(args)
  local kind, board = args[1], args[2]
  local members, seed = tonumber(args[3]), tonumber(args[4])
  local lookup_n = tonumber(args[6] or "500")
  size = tonumber(args[5])
  math.randomseed(seed)
  local base = "/v1/boards/" .. board
  local seen = {}
  for k = 1, size do
    pool[k] = one(kind, base, members, seen, lookup_n)
  end
  local distinct = 0
  for _ in pairs(seen) do
    distinct = distinct + 1
  end
  io.write("wrk-info pool " .. size .. "\n")
  io.write("wrk-info distinct_keys " .. distinct .. "\n")
  io.write("wrk-info first " .. string.match(pool[1], "^[^\r]*") .. "\n")
end

function request()
  return pool[math.random(size)]
end
