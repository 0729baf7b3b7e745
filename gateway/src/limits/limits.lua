-- Flotilla's per-key limits, shared by every gateway replica (gateway/src/limits/shared.rs).
-- The same two token buckets as the in-process store (gateway/src/keys.rs, `Limiter`): each
-- refills `per minute` units over a minute and holds at most that many; the token bucket may
-- go into debt, because tokens are charged after the answer. Time is the server's (TIME), so
-- every replica refills on one clock. One call is atomic: admission checks and takes in one
-- step, so replicas admitting at once never both take the last unit.
--
-- KEYS[1]  the key's hash: <prefix>:<key id> (the id, never the key itself). Fields: r and rt
--          (request level, refilled at), t and tt (token level, refilled at).
-- ARGV[1]  "admit" or "charge"
-- ARGV[2]  requests per minute (0: unlimited)
-- ARGV[3]  tokens per minute (0: unlimited)
-- ARGV[4]  tokens to charge ("charge" only)
-- Returns {1, 0, 0} when admitted or charged; {0, 1, ms} over the request limit, {0, 2, ms}
-- over the token limit, ms being the wait until the bucket allows the next request.
-- The hash expires when both buckets would be full again: an idle key leaves nothing behind,
-- and a missing hash is a full bucket, so expiry changes no answer.

-- Redis before 5 replicates a script whole and refuses writes after TIME unless told to
-- replicate its effects instead; from 5 on this is the default (and a no-op).
if redis.replicate_commands then
  pcall(redis.replicate_commands)
end

local key = KEYS[1]
local op = ARGV[1]
local rpm = tonumber(ARGV[2]) or 0
local tpm = tonumber(ARGV[3]) or 0
local tokens = tonumber(ARGV[4]) or 0

local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000

local state = redis.call('HMGET', key, 'r', 'rt', 't', 'tt')

-- The level of a bucket refilled up to now; a new or expired bucket is full.
local function refill(level, at, per_minute)
  level = tonumber(level)
  at = tonumber(at)
  if level == nil or at == nil then
    return per_minute
  end
  local dt = now - at
  if dt < 0 then
    dt = 0
  end
  return math.min(per_minute, level + dt * per_minute / 60)
end

-- Milliseconds until a bucket at `level` holds one unit.
local function wait_ms(level, per_minute)
  local need = 1 - level
  if need < 0 then
    need = 0
  end
  return math.ceil(need * 60000 / per_minute)
end

local r, t
if rpm > 0 then
  r = refill(state[1], state[2], rpm)
end
if tpm > 0 then
  t = refill(state[3], state[4], tpm)
end

local result = {1, 0, 0}
if op == 'admit' then
  if t ~= nil and t <= 0 then
    result = {0, 2, wait_ms(t, tpm)}
  elseif r ~= nil and r < 1 then
    result = {0, 1, wait_ms(r, rpm)}
  elseif r ~= nil then
    r = r - 1
  end
elseif op == 'charge' then
  if t ~= nil then
    t = t - tokens
  end
else
  return redis.error_reply('flotilla limits: unknown operation ' .. tostring(op))
end

-- Store what changed, exactly (%.17g keeps every bit of a double), and let the hash expire
-- once both buckets are full again, plus a second.
local fields = {}
local full_in = 0
local function keep(name, level, per_minute)
  table.insert(fields, name)
  table.insert(fields, string.format('%.17g', level))
  table.insert(fields, name .. 't')
  table.insert(fields, string.format('%.17g', now))
  local secs = (per_minute - level) * 60 / per_minute
  if secs > full_in then
    full_in = secs
  end
end
if r ~= nil then
  keep('r', r, rpm)
end
if t ~= nil then
  keep('t', t, tpm)
end
if #fields > 0 then
  redis.call('HSET', key, unpack(fields))
  redis.call('PEXPIRE', key, math.ceil(full_in * 1000) + 1000)
end
return result
