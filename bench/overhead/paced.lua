-- wrk script: chat.lua plus pacing with wrk's Lua delay(): after each
-- response a connection waits DELAY_MS (3rd script argument) before its next
-- request, so the offered rate is about connections * 1000 / (DELAY_MS +
-- latency) requests per second (wrk2 is not in Debian).
--
--   wrk -t2 -c10 -d10s -s paced.lua http://127.0.0.1:PORT -- MODEL 64 20   # ~500 req/s
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "chat.lua")

function delay()
  return pause_ms
end
