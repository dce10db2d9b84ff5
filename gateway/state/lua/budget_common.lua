-- What the budget scripts share (gateway/state/budgets.py), included first by
-- budget_reserve.lua and budget_settle.lua.
--
-- KEYS[1]: the scope's counters (a key's or a project's). The period is Redis's clock: the
-- day (days since 1970-01-01, UTC) and the month (year x 12 + month - 1); counters of a
-- period gone are read as 0. `limits` reads a record's budgets, money in billionths.
local function civil(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end
local function first_day(y, m)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100)
    + math.floor((153 * mp + 2) / 5)
  return era * 146097 + doe - 719468
end
local function int(v) return string.format('%d', v) end
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec + tonumber(t[2]) / 1000000
local day = math.floor(sec / 86400)
local y, m = civil(day)
local month = y * 12 + m - 1
local ny, nm = y, m + 1
if nm > 12 then ny, nm = y + 1, 1 end
local resets = {day = (day + 1) * 86400 - now, month = first_day(ny, nm) * 86400 - now}
local FIELDS = {'day_tokens', 'day_cost', 'month_tokens', 'month_cost'}
local c = redis.call('HMGET', KEYS[1], 'day', 'month', 'day_tokens', 'day_cost',
  'month_tokens', 'month_cost', 'held_day_tokens', 'held_day_cost', 'held_month_tokens',
  'held_month_cost', 'held_day', 'held_month')
-- used: what settled requests used; held: what running requests have reserved, stamped
-- with its own period (a writer that knew only `used` may have moved `day` on).
local used, held = {}, {}
for i, f in ipairs(FIELDS) do
  used[f], held[f] = tonumber(c[i + 2] or '0'), tonumber(c[i + 6] or '0')
end
local gone = {day = tonumber(c[1]) ~= day, month = tonumber(c[2]) ~= month}
local held_gone = {day = tonumber(c[11]) ~= day, month = tonumber(c[12]) ~= month}
for _, f in ipairs(FIELDS) do
  local period = string.match(f, '^%a+')
  if gone[period] then used[f] = 0 end
  if held_gone[period] then held[f] = 0 end
end
local function limits(raw)
  local out = {}
  if not raw then return out end
  local b = cjson.decode(raw).budget
  if b == nil or b == cjson.null then return out end
  local function add(name, v, field, period, money)
    if v ~= nil and v ~= cjson.null and v > 0 then
      if money then v = math.floor(v * 1000000000 + 0.5) end
      out[#out + 1] = {name = name, limit = v, field = field, period = period, money = money}
    end
  end
  add('tokens_per_day', b.tokens_per_day, 'day_tokens', 'day', false)
  add('tokens_per_month', b.tokens_per_month, 'month_tokens', 'month', false)
  add('cost_per_day', b.cost_per_day, 'day_cost', 'day', true)
  add('cost_per_month', b.cost_per_month, 'month_cost', 'month', true)
  return out
end
local function save()
  local args = {'day', int(day), 'month', int(month), 'held_day', int(day),
    'held_month', int(month)}
  for _, f in ipairs(FIELDS) do
    args[#args + 1], args[#args + 2] = f, int(used[f])
    args[#args + 1], args[#args + 2] = 'held_' .. f, int(held[f])
  end
  redis.call('HSET', KEYS[1], unpack(args))
  redis.call('EXPIRE', KEYS[1], 40 * 86400)
end
local function ratios(budgets)
  local r = {day = -1, month = -1}
  for _, b in ipairs(budgets) do
    r[b.period] = math.max(r[b.period], (used[b.field] + held[b.field]) / b.limit)
  end
  return {tostring(r.day), tostring(r.month)}
end
