-- The key check, and the admission, in one round trip (gateway/state/admission.py).
--
-- KEYS: key record, request buckets, token buckets, leases. ARGV: the presented key's
-- hash, mode ('check': the key only; 'admit': its request too), lease id ('' to take none),
-- lease seconds. Returns {record or '', refusal of the key ('' when valid)} when the key is
-- refused, only checked or has no limits; else {record, '', admitted (1/0), limit hit,
-- seconds until it frees, requests in the window (this one included), tokens in the
-- window, seconds until the windows are empty again}; numbers as strings (Lua numbers
-- reach Redis as integers). The hashes are compared in Lua: they are hashes of 256-bit
-- secrets, so how long a comparison takes tells an attacker nothing usable.
local raw = redis.call('GET', KEYS[1])
if not raw then return {'', 'unknown'} end
local key = cjson.decode(raw)
if key.secret_hash ~= ARGV[1] then return {'', 'unknown'} end
if key.revoked_at ~= cjson.null then return {raw, 'revoked'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local sec = tonumber(t[1])
if key.expires_at ~= cjson.null and sec >= key.expires_at then return {raw, 'expired'} end
if ARGV[2] == 'check' then return {raw, ''} end
local function limit(value)
  if value == nil or value == cjson.null then return 0 end
  return value
end
local rpm, tpm, conc = limit(key.rpm), limit(key.tpm), limit(key.max_concurrency)
if rpm == 0 and tpm == 0 and conc == 0 then return {raw, ''} end
local function window(key)
  local total, oldest, newest = 0, sec, 0
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local s = tonumber(all[i])
    if s <= sec - 60 then
      redis.call('HDEL', key, all[i])
    else
      total = total + tonumber(all[i + 1])
      if s < oldest then oldest = s end
      if s > newest then newest = s end
    end
  end
  return total, oldest + 60 - now, newest + 60 - now
end
local requests, req_frees, req_empty = window(KEYS[2])
local tokens, tok_frees, tok_empty = window(KEYS[3])
local function no(limit, wait)
  return {raw, '', 0, limit, tostring(wait), tostring(requests), tostring(tokens),
          tostring(req_empty), tostring(tok_empty)}
end
if rpm > 0 and requests >= rpm then return no('requests', req_frees) end
if tpm > 0 and tokens >= tpm then return no('tokens', tok_frees) end
if conc > 0 and ARGV[3] ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  if redis.call('ZCARD', KEYS[4]) >= conc then return no('concurrency', 1) end
  local ttl = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[4], now + ttl, ARGV[3])
  redis.call('EXPIRE', KEYS[4], math.ceil(ttl) + 1)
end
redis.call('HINCRBY', KEYS[2], sec, 1)
redis.call('EXPIRE', KEYS[2], 61)
return {raw, '', 1, '', '0', tostring(requests + 1), tostring(tokens), '60',
        tostring(tok_empty)}
