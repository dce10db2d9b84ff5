-- The background responses one API key has running, each one's lease, how each ended and
-- its event log (gateway/state/response_events.py).
--
-- KEYS[1]: the key's running responses (sorted set: response id -> end of its lease, Unix
--          time in ms, Redis's clock)
-- KEYS[2]: the response's end, once claimed: "<status> <party>", the party that claimed it
--          one of run (the replica that runs it), cancel, reader (found its lease ended),
--          delete
-- KEYS[3]: the response's event log (a stream)
-- ARGV[1]: the operation, ARGV[2]: the response id, then the operation's arguments:
--   start  limit lease_ms   -> 1 started, 0 when the key already runs `limit` responses
--   renew  lease_ms         -> 1 renewed, 0 when another party claimed its end (stop)
--   alive                   -> 1 while its lease runs, else 0
--   stop                    -> 1 (it no longer counts as running)
--   claim  end ttl_ms       -> 1 when `end` is now its end: none was claimed, or the run
--                              changes its own (a failure after it claimed `completed`)
--   append number sse ttl_ms party -> 1 logged, 0 when a party other than `party` claimed
--                              its end (a run that gets 0 stops)
--   close  number ttl_ms    -> 1 the log ended, 0 when it was deleted (or ended already)
--   delete ttl_ms           -> 1: its end is `deleted` whoever claimed it before, its log
--                              deleted; nothing above writes the log again
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

-- The party that claimed the end (false: none claimed).
local function party()
  local ended = redis.call('GET', KEYS[2])
  if not ended then
    return false
  end
  return string.match(ended, ' (%a+)$') or ''
end

-- Logs the entry `number`: 1, or 0 when the log already holds it or a later one (another
-- party ended the log first).
local function log(number, field, value, ms)
  local added = redis.pcall('XADD', KEYS[3], '0-' .. (tonumber(number) + 1), field, value)
  if type(added) == 'table' and added.err then
    return 0
  end
  redis.call('PEXPIRE', KEYS[3], ms)
  return 1
end

if op == 'start' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
    return 0
  end
  lease(tonumber(ARGV[4]))
  return 1
elseif op == 'renew' then
  local by = party()
  if by and by ~= 'run' then
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
elseif op == 'claim' then
  local by = party()
  if by and not (by == 'run' and string.match(ARGV[3], ' run$')) then
    return 0
  end
  redis.call('SET', KEYS[2], ARGV[3], 'PX', tonumber(ARGV[4]))
  return 1
elseif op == 'append' then
  local by = party()
  if by and by ~= ARGV[6] then
    return 0
  end
  return log(ARGV[3], 'sse', ARGV[4], tonumber(ARGV[5]))
elseif op == 'close' then
  if party() == 'delete' then
    return 0
  end
  return log(ARGV[3], 'end', '1', tonumber(ARGV[4]))
elseif op == 'delete' then
  redis.call('SET', KEYS[2], 'deleted delete', 'PX', tonumber(ARGV[3]))
  redis.call('DEL', KEYS[3])
  return 1
end
return redis.error_reply('unknown operation ' .. op)
