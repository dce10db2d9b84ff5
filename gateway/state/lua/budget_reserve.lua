-- Reserve under one scope's budgets (gateway/state/budgets.py).
--
-- KEYS: the scope's counters, its record (a key's or a project's, holding its budgets).
-- ARGV: prompt tokens (at most), tokens per generation, generations, flexible (1: the
-- request set no max_tokens, it may be given fewer), price of a prompt token and of a
-- generated token (billionths), money of the rest (audio, billionths), unpriced (1: the
-- model has no price), the request's id, then what the request itself holds in this scope
-- already as day, month, tokens, money (it will be used: it cannot make room for this).
-- Returns {'none'} (no budget: nothing reserved), {'unpriced', budget}, {'no', budget,
-- seconds until it resets, used, limit, needed} (spent: it cannot fit before the reset),
-- {'held', budget, 0, used, limit, needed, held} (it would fit but for what running
-- requests have reserved) or {'ok', tokens granted per generation, day, month, tokens
-- reserved, money reserved, day ratio, month ratio}.
--! include budget_common
local budgets = limits(redis.call('GET', KEYS[2]))
if #budgets == 0 then return {'none'} end
for _, b in ipairs(budgets) do
  if b.money and ARGV[8] == '1' then return {'unpriced', b.name} end
end
local prompt, per, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local pin, pout, extra = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local function fixed(b) if b.money then return prompt * pin + extra end return prompt end
local function each(b) if b.money then return pout end return 1 end
local own = {day_tokens = 0, day_cost = 0, month_tokens = 0, month_cost = 0}
for i = 10, #ARGV, 4 do
  if tonumber(ARGV[i]) == day then
    own.day_tokens = own.day_tokens + tonumber(ARGV[i + 2])
    own.day_cost = own.day_cost + tonumber(ARGV[i + 3])
  end
  if tonumber(ARGV[i + 1]) == month then
    own.month_tokens = own.month_tokens + tonumber(ARGV[i + 2])
    own.month_cost = own.month_cost + tonumber(ARGV[i + 3])
  end
end
local grant, least = per, per
if ARGV[4] == '1' then
  least = math.min(1, per)
  for _, b in ipairs(budgets) do
    if each(b) > 0 then
      local left = b.limit - used[b.field] - held[b.field] - fixed(b)
      grant = math.min(grant, math.floor(left / (count * each(b))))
    end
  end
end
if grant < least then grant = least end
for _, b in ipairs(budgets) do
  local need = fixed(b) + count * grant * each(b)
  local mine = used[b.field] + own[b.field]
  if used[b.field] >= b.limit or mine + need > b.limit then
    return {'no', b.name, tostring(resets[b.period]), int(mine), int(b.limit), int(need)}
  end
end
for _, b in ipairs(budgets) do
  local need = fixed(b) + count * grant * each(b)
  local total = used[b.field] + held[b.field] + need
  -- Work sized at 0 (counted when it ends) needs some room left, unless the request holds
  -- some already.
  if total > b.limit or (need == 0 and own[b.field] == 0 and total >= b.limit) then
    return {'held', b.name, '0', int(used[b.field]), int(b.limit), int(need),
            int(held[b.field])}
  end
end
local tokens = prompt + count * grant
local cost = prompt * pin + extra + count * grant * pout
held.day_tokens = held.day_tokens + tokens
held.month_tokens = held.month_tokens + tokens
held.day_cost = held.day_cost + cost
held.month_cost = held.month_cost + cost
save()
redis.call('HSET', KEYS[1], 'r:' .. ARGV[9], '1')
local r = ratios(budgets)
return {'ok', int(grant), int(day), int(month), int(tokens), int(cost), r[1], r[2]}
