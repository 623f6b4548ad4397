-- One fixed POST, repeated: wrk -s post.lua URL -- AUTH BODY_FILE
-- AUTH is an API key sent as "Authorization: Bearer AUTH", or "-" for none.
-- done() prints one machine-readable line for bench/run.py:
--   BENCH {"requests":..,"duration_us":..,"p50_us":..,"p90_us":..,"p99_us":..,"errors":..}

function read_file(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end

function set_auth(auth)
  wrk.headers["Content-Type"] = "application/json"
  if auth and auth ~= "-" then
    wrk.headers["Authorization"] = "Bearer " .. auth
  end
end

function init(args)
  set_auth(args[1])
  wrk.method = "POST"
  wrk.body = read_file(args[2])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"errors":%d,"bad_status":%d}\n',
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.connect + e.read + e.write + e.timeout, e.status))
end
