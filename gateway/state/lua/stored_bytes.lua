-- The stored bytes of one scope (an API key, or a project): the sizes of its stored records
-- and of the holds of requests that will store one (gateway/state/stored_bytes.py).
--
-- KEYS[1]: when each entry ends (sorted set: entry -> Unix time in ms)
-- KEYS[2]: each entry's size (hash: entry -> bytes), and their sum under 'total' (entries
--          always hold a ':', so no entry is named 'total')
-- ARGV[1]: the operation, ARGV[2]: how many ended entries one run removes at most, then
-- the operation's arguments:
--   read                          -> total
--   hold  entry bytes ms quota    -> {1, total} held (0 bytes: only checked), or {0, total}
--                                    when it would take the scope past quota (0: none)
--   put   entry bytes ms held     -> total; never refused; replaces the entry and drops the
--                                    entry `held` ('' for none)
--   drop  entry...                -> total
-- Entries whose end has passed are removed first: a record that expired no longer counts,
-- and a hold whose request died is let go. Both keys expire with the last entry.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local total = tonumber(redis.call('HGET', KEYS[2], 'total') or '0')

local function remove(entry)
  local size = redis.call('HGET', KEYS[2], entry)
  if size then
    total = total - tonumber(size)
    redis.call('HDEL', KEYS[2], entry)
  end
  redis.call('ZREM', KEYS[1], entry)
end

local function add(entry, bytes, ms)
  redis.call('ZADD', KEYS[1], now + ms, entry)
  redis.call('HSET', KEYS[2], entry, string.format('%d', bytes))
  total = total + bytes
end

local function save()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', KEYS[1], KEYS[2])
    total = 0
    return
  end
  if total < 0 then total = 0 end
  redis.call('HSET', KEYS[2], 'total', string.format('%d', total))
  local until_ms = math.ceil(tonumber(last[2])) + 1000
  redis.call('PEXPIREAT', KEYS[1], until_ms)
  redis.call('PEXPIREAT', KEYS[2], until_ms)
end

-- At most ARGV[2] of them per run, so that a run stays short: with more left it returns
-- 'more' without doing anything else, and the caller runs it again.
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, entry in ipairs(gone) do
  remove(entry)
end
if #gone == tonumber(ARGV[2]) then
  save()
  return 'more'
end

local op = ARGV[1]
if op == 'hold' then
  local entry, bytes = ARGV[3], tonumber(ARGV[4])
  local ms, quota = tonumber(ARGV[5]), tonumber(ARGV[6])
  local old = tonumber(redis.call('HGET', KEYS[2], entry) or '0')
  local after = total - old + bytes
  -- 0 bytes asks whether there is room at all.
  if quota > 0 and (after > quota or (bytes == 0 and after >= quota)) then
    if #gone > 0 then save() end
    return {0, string.format('%d', total)}
  end
  if bytes > 0 then
    remove(entry)
    add(entry, bytes, ms)
  end
  save()
  return {1, string.format('%d', total)}
elseif op == 'put' then
  remove(ARGV[3])
  if ARGV[6] ~= '' then remove(ARGV[6]) end
  add(ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]))
elseif op == 'drop' then
  for i = 3, #ARGV do remove(ARGV[i]) end
elseif op ~= 'read' then
  return redis.error_reply('unknown operation ' .. tostring(op))
elseif #gone == 0 then
  return string.format('%d', total)
end
save()
return string.format('%d', total)
