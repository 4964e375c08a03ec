-- wrk script: POSTs ~2 KB OpenAI chat bodies to /v1/chat/completions, with
-- "model" as the LAST key (as the OpenAI SDKs write it), cycling over NKEYS
-- session keys in one header, X-Poimen-Cache-Key unless KEY_HEADER names
-- another (each wrk thread starts at another key). Only that one header is
-- sent, so every target gets the same request size but its own key header
-- (vllm-router: X-Session-Id, sglang-router: X-SMG-Routing-Key).
-- TENANT_HEADER, when given, adds that header with the values a and b
-- alternating request by request (odd keys a, even keys b; NKEYS even).
--
--   wrk -t2 -c32 -d10s -s chat.lua http://127.0.0.1:PORT -- MODEL [NKEYS] [DELAY_MS] [KEY_HEADER] [TENANT_HEADER]
--
-- DELAY_MS is read by paced.lua (which loads this file and adds delay());
-- this file defines no delay(), so saturated runs have no timer in the loop.
-- done() prints one line "POIMEN_JSON {...}" with the counts and the latency
-- percentiles (microseconds) of the whole run.

local thread_no = 0

function setup(thread)
  thread_no = thread_no + 1
  thread:set("tid", thread_no)
end

function init(args)
  local model = args[1] or "bench-model"
  nkeys = tonumber(args[2] or "64")
  pause_ms = tonumber(args[3] or "0")
  local key_header = args[4] or "X-Poimen-Cache-Key"
  local tenant_header = args[5]
  -- POIMEN_FILLER_REPS (run.py --body-kb) sets the body's size: 24, ~2 KB.
  local reps = tonumber(os.getenv("POIMEN_FILLER_REPS") or "24")
  local filler = string.rep("The agent keeps notes on the repository, the failing test and the plan. ", reps)
  reqs = {}
  for k = 1, nkeys do
    local key = string.format("bench-session-%03d", k)
    local body = '{"messages":[{"role":"system","content":"You are a coding agent. ' .. filler ..
      '"},{"role":"user","content":"Summarise what ' .. key .. ' did last and propose the next step."}],' ..
      '"max_tokens":16,"temperature":0,"stream":false,"model":"' .. model .. '"}'
    local headers = {["Content-Type"] = "application/json", [key_header] = key}
    if tenant_header and tenant_header ~= "" then
      headers[tenant_header] = (k % 2 == 1) and "a" or "b"
    end
    reqs[k] = wrk.format("POST", "/v1/chat/completions", headers, body)
  end
  idx = ((tid or 1) * 17) % nkeys
end

function request()
  idx = idx % nkeys + 1
  return reqs[idx]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'POIMEN_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"err_connect":%d,"err_read":%d,' ..
    '"err_write":%d,"err_status":%d,"err_timeout":%d,"lat_mean_us":%.1f,"lat_max_us":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
end
