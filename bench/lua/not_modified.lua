-- not_modified.lua: a wrk script (wrk -s, bench/api): every request is the URL's GET with
-- If-None-Match: <args[1]>, the ETag the API gave it, so each answer is a 304.
local req

function init(args)
  req = wrk.format(nil, nil, {["If-None-Match"] = args[1]})
end

function request()
  return req
end
