-- A key's end of request in one run (gateway/state/budgets.py): its rate limits'
-- limits_finish.lua, then its budget's budget_settle.lua (the same slot).
--
-- KEYS: limits_finish's, then budget_settle's (none: no budget work). ARGV: how many of
-- limits_finish's arguments and keys come first, then limits_finish's arguments, then
-- budget_settle's. Returns budget_settle's answer ({'-1', '-1'} without budget work).
local function finish(KEYS, ARGV)
--! include limits_finish
end
local function settle(KEYS, ARGV)
--! include budget_settle
end
local n, k = tonumber(ARGV[1]), tonumber(ARGV[2])
local fk, fa, sk, sa = {}, {}, {}, {}
for i = 1, k do fk[i] = KEYS[i] end
for i = k + 1, #KEYS do sk[#sk + 1] = KEYS[i] end
for i = 1, n do fa[i] = ARGV[i + 2] end
for i = n + 3, #ARGV do sa[#sa + 1] = ARGV[i] end
finish(fk, fa)
if #sk == 0 then return {'-1', '-1'} end
return settle(sk, sa)
