-- A rotating mix of POSTs, for the soak: wrk -s mix.lua URL -- AUTH PATH BODY_FILE [PATH BODY_FILE]...
-- Run from bench/ (it loads post.lua for read_file, set_auth and done).
dofile("post.lua")

local requests = {}
local next_index = 0

function init(args)
  set_auth(args[1])
  for i = 2, #args, 2 do
    requests[#requests + 1] = wrk.format("POST", args[i], nil, read_file(args[i + 1]))
  end
end

function request()
  next_index = next_index % #requests + 1
  return requests[next_index]
end
