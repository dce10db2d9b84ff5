-- The background responses one API key has running, and each one's lease
-- (gateway/state/response_events.py).
--
-- KEYS[1]: the key's running responses (sorted set: response id -> end of its lease, Unix
--          time in ms, Redis's clock)
-- KEYS[2]: the response's end (a string: the status it ended with, once claimed)
-- ARGV[1]: the operation, ARGV[2]: the response id, then the operation's arguments:
--   start  limit lease_ms  -> 1 started, 0 when the key already runs `limit` responses
--   renew  lease_ms        -> 1 renewed, 0 when the response has an end (cancelled, or
--                             failed by a reader that found its lease ended): stop
--   alive                  -> 1 while its lease runs, else 0
--   stop                   -> 1 (it no longer counts as running)
-- Ended leases are removed first, so a response whose replica died stops counting as
-- running after one lease. The set expires with its last lease.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, id = ARGV[1], ARGV[2]

local function lease(ms)
  redis.call('ZADD', KEYS[1], now + ms, id)
  -- Every lease has the same length: the newest ends last.
  redis.call('PEXPIRE', KEYS[1], ms)
end

if op == 'start' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
    return 0
  end
  lease(tonumber(ARGV[4]))
  return 1
elseif op == 'renew' then
  if redis.call('EXISTS', KEYS[2]) == 1 then
    return 0
  end
  lease(tonumber(ARGV[3]))
  return 1
elseif op == 'alive' then
  local ends = redis.call('ZSCORE', KEYS[1], id)
  if ends and tonumber(ends) > now then
    return 1
  end
  return 0
elseif op == 'stop' then
  redis.call('ZREM', KEYS[1], id)
  return 1
end
return redis.error_reply('unknown operation ' .. op)
