-- wrk script for bench.api_load (scenario E).
--
--   wrk -t2 -c16 -d12s --latency -s bench/wrk_runs.lua http://127.0.0.1:PORT -- post TOKEN
--   wrk -t2 -c16 -d12s --latency -s bench/wrk_runs.lua http://127.0.0.1:PORT -- get TOKEN IDS_FILE
--   wrk -t2 -c16 -d12s --latency -s bench/wrk_runs.lua http://127.0.0.1:PORT -- batch TOKEN [RUNS]
--
-- post: POST /api/v1/runs {"workflow": "bench-e", "input": {}}, a new run each time.
-- get:  GET /api/v1/runs/{id}, round-robin over the run ids in IDS_FILE (one a line), each thread from
--       another place in the list.
-- batch: POST /api/v1/runs/batch of RUNS (default 100) runs {"workflow": "bench-e", "input": {}}.
-- Every answer's status code is counted (per thread; done() adds them up), so non-2xx answers are reported
-- whatever they are. done() prints one line: WRK_RESULT {json}; latencies in microseconds.

local threads = {}
local thread_count = 0

function setup(thread)
   thread_count = thread_count + 1
   thread:set("thread_no", thread_count)
   table.insert(threads, thread)
end

codes = {}
local requests_list = {}
local pos = 0

function init(args)
   local mode, token = args[1], args[2]
   local headers = {["Authorization"] = "Bearer " .. token, ["Accept"] = "application/json"}
   if mode == "post" then
      headers["Content-Type"] = "application/json"
      requests_list[1] = wrk.format("POST", "/api/v1/runs", headers, '{"workflow":"bench-e","input":{}}')
   elseif mode == "get" then
      for line in io.lines(args[3]) do
         if #line > 0 then
            requests_list[#requests_list + 1] = wrk.format("GET", "/api/v1/runs/" .. line, headers)
         end
      end
   elseif mode == "batch" then
      headers["Content-Type"] = "application/json"
      local items = {}
      for i = 1, tonumber(args[3] or "100") do
         items[i] = '{"workflow":"bench-e","input":{}}'
      end
      requests_list[1] = wrk.format("POST", "/api/v1/runs/batch", headers, '{"runs":[' .. table.concat(items, ",") .. ']}')
   else
      error("mode must be post, get or batch, not " .. tostring(mode))
   end
   if #requests_list == 0 then
      error("no requests to send")
   end
   pos = ((thread_no or 1) * 37) % #requests_list
end

function request()
   pos = pos % #requests_list + 1
   return requests_list[pos]
end

function response(status, headers, body)
   local key = tostring(status)
   codes[key] = (codes[key] or 0) + 1
end

function done(summary, latency, requests)
   local total = {}
   for _, thread in ipairs(threads) do
      local counted = thread:get("codes")
      if counted then
         for key, n in pairs(counted) do
            total[key] = (total[key] or 0) + n
         end
      end
   end
   local parts = {}
   for key, n in pairs(total) do
      parts[#parts + 1] = string.format('"%s":%d', key, n)
   end
   local e = summary.errors
   io.write(string.format(
      'WRK_RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,' ..
      '"mean_us":%.1f,"socket_errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d},"status_errors":%d,' ..
      '"codes":{%s}}\n',
      summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
      latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.timeout, e.status,
      table.concat(parts, ",")))
end
