-- One batch's work: its lines to do, the lines leased to a replica, the lines done and their
-- results, its status (gateway/state/batches.py). Every key carries the batch id as its
-- hash tag (one slot).
--
-- KEYS[1]: status (string: validating, in_progress, cancelling, finalizing, ...)
-- KEYS[2]: times (hash: <status>_at -> Unix seconds)
-- KEYS[3]: todo (list of line indexes not leased)
-- KEYS[4]: lines (hash: index -> the request line's JSON)
-- KEYS[5]: leases (sorted set: index -> end of its lease, Unix ms by Redis's clock)
-- KEYS[6]: done (set of the indexes answered, each once)
-- KEYS[7]: output (list of result lines of requests answered 2xx)
-- KEYS[8]: errors (list of result lines of the others)
-- KEYS[9]: counts (hash: total, completed, failed, input_tokens, output_tokens,
--          reasoning_tokens, attempts:<index>)
-- ARGV[1]: the operation, then its arguments:
--   claim  n lease_ms             -> {index, line, ...}: up to n lines leased to the caller
--                                    (none unless in_progress); leases that ended (their
--                                    replica died) go back to todo first
--   renew  lease_ms index...      -> how many of these leases were still held (renewed)
--   finish index kind line in out reasoning cap short
--                                 (cap: the most bytes of results the batch keeps; past
--                                 it, `short` is written instead, counted as failed)
--                                 -> the lines left to answer, or -1 when this index was
--                                    answered already or the batch has ended (its result
--                                    is dropped: each request is answered once). kind:
--                                    completed or failed
--   retry  index max_attempts     -> 1 the line is back in todo (last), 0 when it was
--                                    answered meanwhile, -1 when it was tried max_attempts
--                                    times (the caller answers it as failed)
--   release index...              -> leases given back unanswered (a cancelled run)
--   move   to now_s from...       -> 1 when the status was one of `from` and is now `to`
--                                    (its time set), else 0
--   leased                        -> how many lines are leased
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]

-- A key written here expires with the batch (its status key's TTL), whatever writes it.
local function keep(key)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('PEXPIRE', key, ttl)
  end
end

local function requeue_ended()
  local ended = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
  for _, index in ipairs(ended) do
    redis.call('ZREM', KEYS[5], index)
    if redis.call('SISMEMBER', KEYS[6], index) == 0 then
      redis.call('LPUSH', KEYS[3], index)
    end
  end
end

if op == 'claim' then
  requeue_ended()
  if redis.call('GET', KEYS[1]) ~= 'in_progress' then
    return {}
  end
  local n, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
  local out = {}
  for _ = 1, n do
    local index = redis.call('LPOP', KEYS[3])
    if not index then
      break
    end
    redis.call('ZADD', KEYS[5], now + lease, index)
    keep(KEYS[5])
    out[#out + 1] = index
    out[#out + 1] = redis.call('HGET', KEYS[4], index) or ''
  end
  return out
elseif op == 'renew' then
  local renewed = 0
  for i = 3, #ARGV do
    renewed = renewed + redis.call('ZADD', KEYS[5], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[i])
  end
  return renewed
elseif op == 'finish' then
  local index = ARGV[2]
  local status = redis.call('GET', KEYS[1])
  if status ~= 'in_progress' and status ~= 'cancelling' and status ~= 'finalizing' then
    return -1 -- the batch ended (its results are written): a late answer is dropped
  end
  if redis.call('SADD', KEYS[6], index) == 0 then
    return -1
  end
  redis.call('ZREM', KEYS[5], index)
  local kind, line = ARGV[3], ARGV[4]
  if tonumber(redis.call('HGET', KEYS[9], 'result_bytes') or '0') + #line > tonumber(ARGV[8]) then
    kind, line = 'failed', ARGV[9]
  end
  redis.call('HINCRBY', KEYS[9], 'result_bytes', #line)
  local results = kind == 'completed' and KEYS[7] or KEYS[8]
  redis.call('RPUSH', results, line)
  keep(KEYS[6])
  keep(results)
  redis.call('HINCRBY', KEYS[9], kind, 1)
  redis.call('HINCRBY', KEYS[9], 'input_tokens', tonumber(ARGV[5]))
  redis.call('HINCRBY', KEYS[9], 'output_tokens', tonumber(ARGV[6]))
  redis.call('HINCRBY', KEYS[9], 'reasoning_tokens', tonumber(ARGV[7]))
  redis.call('HDEL', KEYS[9], 'attempts:' .. index)
  local total = tonumber(redis.call('HGET', KEYS[9], 'total') or '0')
  return total - redis.call('SCARD', KEYS[6])
elseif op == 'retry' then
  local index = ARGV[2]
  if redis.call('SISMEMBER', KEYS[6], index) == 1 then
    return 0
  end
  if redis.call('HINCRBY', KEYS[9], 'attempts:' .. index, 1) >= tonumber(ARGV[3]) then
    return -1
  end
  redis.call('ZREM', KEYS[5], index)
  redis.call('RPUSH', KEYS[3], index)
  keep(KEYS[3])
  keep(KEYS[9])
  return 1
elseif op == 'release' then
  for i = 2, #ARGV do
    if redis.call('ZREM', KEYS[5], ARGV[i]) == 1 and redis.call('SISMEMBER', KEYS[6], ARGV[i]) == 0 then
      redis.call('LPUSH', KEYS[3], ARGV[i])
      keep(KEYS[3])
    end
  end
  return 1
elseif op == 'move' then
  local status = redis.call('GET', KEYS[1])
  for i = 4, #ARGV do
    if status == ARGV[i] then
      redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
      redis.call('HSET', KEYS[2], ARGV[2] .. '_at', ARGV[3])
      return 1
    end
  end
  return 0
elseif op == 'leased' then
  requeue_ended()
  return redis.call('ZCARD', KEYS[5])
end
return redis.error_reply('unknown operation ' .. op)
