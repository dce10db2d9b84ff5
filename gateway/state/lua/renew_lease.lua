-- Renews a concurrency lease (gateway/state/admission.py).
--
-- KEYS: leases. ARGV: lease id, lease seconds. Pushes the lease's expiry (and the set's)
-- forward if it is still held.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
-- The set itself must outlive the renewed lease (every lease has the same length).
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 1)
end
return 1
