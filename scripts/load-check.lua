-- wrk script for scripts/load-check: non-streaming chat completions with realistic bodies.
--
-- wrk sends GET without a body unless a script says otherwise, so this script builds a
-- pool of POOL_SIZE chat bodies (4-8 KiB each) and sends them in turn, each thread
-- starting at its own offset. Every body shares one system prompt and tool list (as the
-- conversations of one application do) and then has its own turns, so the gateway keys a
-- shared head and a distinct tail, and a repeated body matches its whole prefix.
--
-- The pool is built the same way in every Lua state (a fixed-seed generator), so the
-- gateway run and the direct run send the same bytes. done() prints one machine-readable
-- line, `LOADCHECK key=value ...`, that scripts/load-check parses.

local POOL_SIZE = 64

-- A small linear congruential generator: math.random differs between Lua builds, and the
-- pool must be identical in every thread and run.
local state = 12345
local function rand(n)
  state = (state * 1103515245 + 12345) % 2147483648
  return math.floor(state / 65536) % n + 1
end

local WORDS = {
  "the", "gateway", "routes", "each", "request", "to", "a", "site", "whose", "engines",
  "hold", "prompt", "prefix", "in", "cache", "queue", "depth", "window", "cluster",
  "endpoint", "latency", "token", "budget", "summary", "report", "quarterly", "revenue",
  "customer", "invoice", "shipment", "delayed", "because", "of", "weather", "please",
  "explain", "why", "and", "how", "we", "should", "fix", "it", "before", "Friday",
  "with", "numbers", "from", "last", "week", "table", "compare", "regions", "east",
  "west", "north", "south", "growth", "was", "about", "percent", "while", "costs", "rose",
}

-- `n` words of prose; a line break (JSON `\n`) about every 12 words and a quoted phrase
-- (JSON `\"`) now and then, so the gateway's string decoder does real work.
local function prose(n)
  local parts = {}
  for i = 1, n do
    local word = WORDS[rand(#WORDS)]
    if rand(40) == 1 then
      word = '\\"' .. word .. '\\"'
    end
    parts[#parts + 1] = word
    if i % 12 == 0 then
      parts[#parts + 1] = "\\n"
    end
  end
  return table.concat(parts, " ")
end

local SYSTEM = "You are the operations assistant of a logistics company. " .. prose(260)

local TOOLS = [[[{"type":"function","function":{"name":"lookup_shipment","description":"Find a shipment by its tracking number and return its status, route and estimated arrival.","parameters":{"type":"object","properties":{"tracking_number":{"type":"string","description":"The carrier's tracking number"},"include_history":{"type":"boolean"}},"required":["tracking_number"]}}},{"type":"function","function":{"name":"revenue_report","description":"Revenue by region and week, in thousands of euros.","parameters":{"type":"object","properties":{"region":{"type":"string","enum":["east","west","north","south"]},"weeks":{"type":"integer","minimum":1,"maximum":52}},"required":["region"]}}}] ]]

local function chat_body(i)
  local turns = {
    string.format('{"role":"system","content":"%s"}', SYSTEM),
    string.format('{"role":"user","content":"Conversation %d. %s"}', i, prose(90 + rand(160))),
    string.format('{"role":"assistant","content":"%s"}', prose(110 + rand(220))),
    string.format('{"role":"user","content":"%s"}', prose(40 + rand(160))),
  }
  return string.format(
    '{"model":"demo-model","messages":[%s],"tools":%s,"temperature":0.7,"max_tokens":256,"stream":false}',
    table.concat(turns, ","), TOOLS)
end

local bodies = {}
for i = 1, POOL_SIZE do
  bodies[i] = chat_body(i)
end

local threads = {}
local thread_count = 0

function setup(thread)
  thread_count = thread_count + 1
  thread:set("offset", thread_count * 7)
  threads[#threads + 1] = thread
end

local requests = {}
local next_request = 1

function init(args)
  local headers = { ["Content-Type"] = "application/json" }
  for i, body in ipairs(bodies) do
    requests[i] = wrk.format("POST", nil, headers, body)
  end
  next_request = ((offset or 0) % POOL_SIZE) + 1
end

function request()
  local r = requests[next_request]
  next_request = next_request % POOL_SIZE + 1
  return r
end

function done(summary, latency)
  local smallest, largest, total = math.huge, 0, 0
  for _, body in ipairs(bodies) do
    smallest = math.min(smallest, #body)
    largest = math.max(largest, #body)
    total = total + #body
  end
  local errors = summary.errors
  io.write(string.format(
    "LOADCHECK requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d " ..
    "errors_connect=%d errors_read=%d errors_write=%d errors_status=%d errors_timeout=%d " ..
    "body_min=%d body_mean=%d body_max=%d\n",
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    errors.connect, errors.read, errors.write, errors.status, errors.timeout,
    smallest, math.floor(total / #bodies), largest))
end
