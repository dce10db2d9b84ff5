-- Reserve tokens under a key's tpm (gateway/state/limits.py).
--
-- KEYS: token buckets. ARGV: tpm, prompt tokens, tokens per generation, generations,
-- flexible (1: the request set no max_tokens, so it may be given fewer). Returns {'ok',
-- tokens granted per generation, bucket (second) of the reservation} or {'no', seconds
-- until the window frees} or {'too_large'} (the request can never fit the limit).
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec + tonumber(t[2]) / 1000000
local total, oldest = 0, sec
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local s = tonumber(all[i])
  if s <= sec - 60 then
    redis.call('HDEL', KEYS[1], all[i])
  else
    total = total + tonumber(all[i + 1])
    if s < oldest then oldest = s end
  end
end
local tpm, prompt, per, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4])
local least = per
if ARGV[5] == '1' then least = 1 end
if prompt + count * least > tpm then return {'too_large'} end
local grant = per
if ARGV[5] == '1' then grant = math.min(per, math.floor((tpm - total - prompt) / count)) end
if grant < least or prompt + count * grant > tpm - total then
  return {'no', tostring(oldest + 60 - now)}
end
redis.call('HINCRBY', KEYS[1], sec, prompt + count * grant)
redis.call('EXPIRE', KEYS[1], 61)
return {'ok', tostring(grant), tostring(sec)}
