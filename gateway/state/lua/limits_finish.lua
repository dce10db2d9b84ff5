-- The end of a key's request (gateway/state/limits.py): its lease released, its tokens
-- settled in the window, its usage recorded.
--
-- KEYS: token buckets, leases, usage, usage by model. ARGV: tokens, lease id, prompt
-- tokens, completion tokens, audio seconds in, audio seconds out, the model (counted in its
-- own fields when not empty), record (0: no usage recorded), then the reservations as
-- bucket, tokens pairs. The tokens used fill the reservations in turn; each reservation
-- still in the window is settled to its share in its own bucket (never below zero), one
-- that has left the window counts no more; tokens beyond all reservations are counted now.
local sec = tonumber(redis.call('TIME')[1])
local left = tonumber(ARGV[1])
for i = 9, #ARGV, 2 do
  local at, reserved = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local share = math.min(left, reserved)
  left = left - share
  if at > sec - 60 and share < reserved then
    local held = tonumber(redis.call('HGET', KEYS[1], at) or '0')
    local change = math.max(share - reserved, -held)
    if change ~= 0 then redis.call('HINCRBY', KEYS[1], at, change) end
  end
end
if left > 0 then
  redis.call('HINCRBY', KEYS[1], sec, left)
  redis.call('EXPIRE', KEYS[1], 61)
end
if ARGV[2] ~= '' then redis.call('ZREM', KEYS[2], ARGV[2]) end
if ARGV[8] == '0' then return 1 end
redis.call('HINCRBY', KEYS[3], 'requests', 1)
redis.call('HINCRBY', KEYS[3], 'prompt_tokens', ARGV[3])
redis.call('HINCRBY', KEYS[3], 'completion_tokens', ARGV[4])
redis.call('HINCRBYFLOAT', KEYS[3], 'audio_seconds_in', ARGV[5])
redis.call('HINCRBYFLOAT', KEYS[3], 'audio_seconds_out', ARGV[6])
if ARGV[7] ~= '' then
  redis.call('HINCRBY', KEYS[4], 'requests:' .. ARGV[7], 1)
  redis.call('HINCRBY', KEYS[4], 'prompt_tokens:' .. ARGV[7], ARGV[3])
  redis.call('HINCRBY', KEYS[4], 'completion_tokens:' .. ARGV[7], ARGV[4])
end
return 1
