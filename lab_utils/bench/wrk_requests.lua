-- wrk script for `python -m lab_utils.bench.proxy`: one POST per logical request, or the
-- prefill/decode protocol done by the client itself (no proxy), timed per logical request.
--
--   wrk -t C -c C -d 3s -s wrk_requests.lua URL -- single BODY
--   wrk -t C -c C -d 3s -s wrk_requests.lua URL -- pd PREFILL_BODY DECODE_HEAD DECODE_TAIL
--
-- One thread per connection (-t equal to -c), so a thread's globals are one connection's
-- state: in "pd", each logical request is a prefill POST, then a decode POST whose body is
-- DECODE_HEAD .. <the kv_transfer_params object of that prefill's answer> .. DECODE_TAIL.
-- The clock (CLOCK_MONOTONIC) starts when wrk asks for the first request and stops at the
-- last response. done() prints one JSON line: logical requests, errors, p50/p99 in ms.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } lab_timespec;
int clock_gettime(int clk_id, lab_timespec *tp);
]]
local ts = ffi.new("lab_timespec")
local function now_us()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

-- per-thread (= per-connection) state
latencies = {}
errors = 0
bad = ""
local kind, first_req, head, tail
local in_decode, t0 = false, 0

function init(args)
  kind = args[1]
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  first_req = wrk.format(nil, nil, nil, args[2])
  head, tail = args[3], args[4]
end

function request()
  if in_decode then
    return decode_req
  end
  t0 = now_us()
  return first_req
end

local function finish(status, body)
  if status ~= 200 then
    errors = errors + 1
    bad = status .. " " .. string.gsub(string.sub(body or "", 1, 200), '[%c"\\]', " ")
  end
  latencies[#latencies + 1] = now_us() - t0
  in_decode = false
end

function response(status, headers, body)
  if kind ~= "pd" or in_decode then
    return finish(status, body)
  end
  -- the prefill's answer: splice its kv_transfer_params object into the decode body
  local s = status == 200 and string.find(body, '"kv_transfer_params":', 1, true)
  if not s then
    return finish(status == 200 and 502 or status, body)
  end
  local open = string.find(body, "{", s, true)
  local depth, i = 0, open
  repeat
    local c = string.sub(body, i, i)
    if c == "{" then depth = depth + 1 elseif c == "}" then depth = depth - 1 end
    i = i + 1
  until depth == 0
  decode_req = wrk.format(nil, nil, nil, head .. string.sub(body, open, i - 1) .. tail)
  in_decode = true
end

function done(summary, latency, requests)
  local all, errs, last = {}, 0, ""
  for _, thread in ipairs(threads) do
    for _, v in ipairs(thread:get("latencies")) do
      all[#all + 1] = v
    end
    errs = errs + thread:get("errors")
    local b = thread:get("bad")
    if b ~= "" then last = b end
  end
  table.sort(all)
  local function pct(q)
    if #all == 0 then return -1 end
    return all[math.max(1, math.ceil(q / 100 * #all))] / 1e3
  end
  io.write(string.format(
    '{"requests": %d, "errors": %d, "duration_s": %.6f, "p50_ms": %.4f, "p99_ms": %.4f, ' ..
    '"socket_errors": %d, "last_error": "%s"}\n',
    #all, errs, summary.duration / 1e6, pct(50), pct(99),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    last))
end
