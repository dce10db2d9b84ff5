-- Settle a request's use under one scope's budgets (gateway/state/budgets.py).
--
-- KEYS: the scope's counters, its history of the day, its record (absent: no budget to
-- report the use of). ARGV: tokens used, money used (billionths), the model ('' : no
-- history), the key (a project's history counts by key too; '' for a key's own), prompt
-- tokens, completion tokens, charge (1; 0: work no client asked for, charged nothing), the
-- request's id, then the reservations as day, month, tokens, money. A request with
-- reservations is settled once: run again (a retry after a lost reply), the script changes
-- nothing.
-- The usage fills the reservations in turn; each one of a period still current leaves what
-- is held and its share is used, one of a period gone counts no more; usage beyond them all
-- is counted now. Returns the day's and the month's ratio (-1: no budget).
-- HISTORY_S (the seconds a day's history is kept) is set by the loader.
--! include budget_common
local tokens, cost = tonumber(ARGV[1]), tonumber(ARGV[2])
if ARGV[7] ~= '1' then tokens, cost = 0, 0 end
local function report()
  if not KEYS[3] then return {'-1', '-1'} end
  return ratios(limits(redis.call('GET', KEYS[3])))
end
if #ARGV > 8 and redis.call('HDEL', KEYS[1], 'r:' .. ARGV[8]) == 0 then return report() end
for i = 9, #ARGV, 4 do
  local rt, rc = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local st, sc = math.min(tokens, rt), math.min(cost, rc)
  tokens, cost = tokens - st, cost - sc
  if tonumber(ARGV[i]) == day then
    held.day_tokens = math.max(held.day_tokens - rt, 0)
    held.day_cost = math.max(held.day_cost - rc, 0)
    used.day_tokens, used.day_cost = used.day_tokens + st, used.day_cost + sc
  end
  if tonumber(ARGV[i + 1]) == month then
    held.month_tokens = math.max(held.month_tokens - rt, 0)
    held.month_cost = math.max(held.month_cost - rc, 0)
    used.month_tokens, used.month_cost = used.month_tokens + st, used.month_cost + sc
  end
end
used.day_tokens = used.day_tokens + tokens
used.month_tokens = used.month_tokens + tokens
used.day_cost = used.day_cost + cost
used.month_cost = used.month_cost + cost
save()
if ARGV[7] == '1' and ARGV[3] ~= '' then
  local function count(prefix)
    redis.call('HINCRBY', KEYS[2], prefix .. 'requests', 1)
    redis.call('HINCRBY', KEYS[2], prefix .. 'prompt_tokens', ARGV[5])
    redis.call('HINCRBY', KEYS[2], prefix .. 'completion_tokens', ARGV[6])
    redis.call('HINCRBY', KEYS[2], prefix .. 'cost', ARGV[2])
  end
  count('')
  local function by(kind, name)
    for _, what in ipairs({'requests', 'prompt_tokens', 'completion_tokens', 'cost'}) do
      local value = ARGV[2]
      if what == 'requests' then value = 1
      elseif what == 'prompt_tokens' then value = ARGV[5]
      elseif what == 'completion_tokens' then value = ARGV[6] end
      redis.call('HINCRBY', KEYS[2], kind .. ':' .. what .. ':' .. name, value)
    end
  end
  by('m', ARGV[3])
  if ARGV[4] ~= '' then by('k', ARGV[4]) end
  redis.call('EXPIRE', KEYS[2], HISTORY_S)
end
return report()
