"""Projects, budgets and spend (docs/budgets.md), held in Redis so that every replica
enforces one figure.

A key may belong to a project; a key and a project may each have budgets in tokens
(prompt + completion) or in money (at the prices of ``GATEWAY_PRICES``), per calendar day
and per calendar month in UTC (Redis's clock). Each scope (a key, a project) keeps its
period's counters in one hash, and one Lua script run per scope reserves or settles, so
the check and the increment cannot interleave between replicas:

- **Reserve** (:data:`_RESERVE`, at the start of the work, with the token reservation of
  ``tpm``): the prompt at most one token per UTF-8 byte (no tokenizer makes more from text;
  one more for the begin-of-sequence token an engine may add) plus ``n x max_tokens``, or
  their price, must fit what every budget of the scope has left, else 429
  ``budget_exceeded`` naming when the period resets. What running requests have reserved
  is held apart from what ended ones used: a request that would fit but for it gets a 429
  ``budget_held`` the SDKs retry. A request with no ``max_tokens`` is given what is left.
  Work that cannot be sized beforehand (speech; a transcription's money is, from its
  duration) is refused once a budget is spent and counted when it ends.
- **Settle** (:data:`_SETTLE`, when the response has been sent, whatever its outcome):
  the reservations are released and replaced by what the request used, in the period they
  were taken in; a request that failed used nothing, so its reservation is released. The spend is
  added to the scope's history of the day (by model; a project's by key too), which
  ``GET /admin/spend`` and ``/v1/me`` read.

A key's counters carry its id as their Redis Cluster hash tag (the key's slot); a
project's carry the project's id (another slot): a project's budget is its own script run.
The budgets themselves are read from the key's or the project's record by the script, so a
change applies to the next request on every replica. Money is counted in billionths of the
price table's unit, as integers (exact in Lua's doubles up to 2^53).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.config import ModelPrice
from gateway.errors import (
    BudgetExceededError,
    BudgetHeldError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)
from gateway.state.keys import PROJECT_ID, ApiKey, Budget, budget_or_none, record_key
from gateway.state.limits import _FINISH, Meter
from gateway.state.redis import PREFIX, needs_store

if TYPE_CHECKING:
    from gateway.metrics import Metrics
    from gateway.state.admission import Admission

logger = logging.getLogger("gateway.state.budgets")

#: Money is counted in billionths of the price table's unit.
NANO = 1_000_000_000
#: How long a day's spend history is kept.
HISTORY_DAYS = 400
#: The longest range ``GET /admin/spend`` reads at once, in days.
MAX_SPEND_DAYS = 92
_PROJECTS = f"{PREFIX}projects"
#: Commands in one pipeline of ``GET /admin/spend``.
_BATCH = 1000

Scope = Literal["key", "project"]

# What both scripts share. KEYS[1]: the scope's counters. The period is Redis's clock: the
# day (days since 1970-01-01, UTC) and the month (year x 12 + month - 1); counters of a
# period gone are read as 0. `limits` reads a record's budgets, money in billionths.
_COMMON = """
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
"""

# KEYS: the scope's counters, its record (a key's or a project's, holding its budgets).
# ARGV: prompt tokens (at most), tokens per generation, generations, flexible (1: the
# request set no max_tokens, it may be given fewer), price of a prompt token and of a
# generated token (billionths), money of the rest (audio, billionths), unpriced (1: the
# model has no price), the request's id, then what the request itself holds in this scope
# already as day, month, tokens, money (it will be used: it cannot make room for this).
# Returns {'none'} (no budget: nothing reserved), {'unpriced', budget}, {'no', budget,
# seconds until it resets, used, limit, needed} (spent: it cannot fit before the reset),
# {'held', budget, 0, used, limit, needed, held} (it would fit but for what running
# requests have reserved) or {'ok', tokens granted per generation, day, month, tokens
# reserved, money reserved, day ratio, month ratio}.
_RESERVE = (
    _COMMON
    + """
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
"""
)

# KEYS: the scope's counters, its history of the day, its record (absent: no budget to
# report the use of). ARGV: tokens used, money
# used (billionths), the model ('' : no history), the key (a project's history counts by
# key too; '' for a key's own), prompt tokens, completion tokens, charge (1; 0: work no
# client asked for, charged nothing), the request's id, then the reservations as day,
# month, tokens, money. A request with reservations is settled once: run again (a retry
# after a lost reply), the script changes nothing.
# The usage fills the reservations in turn; each one of a period still current leaves what
# is held and its share is used, one of a period gone counts no more; usage beyond them all
# is counted now. Returns the day's and the month's ratio (-1: no budget).
_SETTLE = (
    _COMMON
    + """
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
""".replace("HISTORY_S", str(HISTORY_DAYS * 86400))
)


# A key's end of request in one run: its rate limits' _FINISH, then its budget's _SETTLE
# (the same slot). KEYS: _FINISH's, then _SETTLE's (none: no budget work). ARGV: how many
# of _FINISH's arguments and keys come first, then _FINISH's arguments, then _SETTLE's.
_FINISH_AND_SETTLE = (
    "local function finish(KEYS, ARGV)\n"
    + _FINISH
    + "\nend\nlocal function settle(KEYS, ARGV)\n"
    + _SETTLE
    + """
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
"""
)


def counters_key(scope: Scope, name: str) -> str:
    """A key's or a project's budget counters (the current day's and month's)."""
    return f"{PREFIX}budget:{{{name}}}" if scope == "key" else f"{PREFIX}pbudget:{{{name}}}"


def history_key(scope: Scope, name: str, date: str) -> str:
    """A key's or a project's spend on ``date`` (``YYYY-MM-DD``, UTC)."""
    kind = "spend" if scope == "key" else "pspend"
    return f"{PREFIX}{kind}:{{{name}}}:{date}"


async def _to_the_end(call: Awaitable[Any]) -> tuple[Any, bool]:
    """``call``'s result, and whether the request was cancelled meanwhile (its client went
    away): a reservation the script made must reach the meter, which settles it, or it
    would be held until its period ends; the caller raises the cancellation then."""
    task = asyncio.ensure_future(call)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True


def project_key(project_id: str) -> str:
    return f"{PREFIX}project:{{{project_id}}}"


def _record(scope: Scope, name: str) -> str:
    return record_key(name) if scope == "key" else project_key(name)


@dataclass(frozen=True)
class Price:
    """A model's prices in billionths of the price table's unit: per token, per second."""

    input: int
    output: int
    audio_input: float
    audio_output: float

    @classmethod
    def of(cls, price: ModelPrice) -> Price:
        # Per million tokens -> billionths per token: x 1000, rounded to a thousandth.
        return cls(
            input=round(price.input * 1000),
            output=round(price.output * 1000),
            audio_input=price.audio_input * NANO / 60,
            audio_output=price.audio_output * NANO / 60,
        )

    def cost(self, meter: Meter) -> int:
        """What ``meter``'s usage costs, in billionths."""
        return (
            meter.prompt_tokens * self.input
            + meter.completion_tokens * self.output
            + round(meter.audio_seconds_in * self.audio_input)
            + round(meter.audio_seconds_out * self.audio_output)
        )


class Prices:
    """``GATEWAY_PRICES``: a model's own entry, else ``"*"``'s, else none."""

    def __init__(self, table: dict[str, ModelPrice]) -> None:
        self._table = {model: Price.of(price) for model, price in table.items()}

    def get(self, model: str) -> Price | None:
        return self._table.get(model) or self._table.get("*")


def prompt_bound(text: str) -> int:
    """The most tokens ``text`` can be as a prompt: one per UTF-8 byte, and one for the
    begin-of-sequence token an engine may add."""
    return len(text.encode("utf-8")) + 1


class ProjectCreate(BaseModel):
    """Body of ``POST /admin/projects``."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=PROJECT_ID, description="Lowercase letters, digits, '.', '_', '-'.")
    name: str | None = Field(None, min_length=1, max_length=100)
    budget: Budget | None = None


class ProjectUpdate(BaseModel):
    """Body of ``PATCH /admin/projects/{id}``: the fields given are set (``null`` clears
    the budget), the others stay."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, max_length=100)
    budget: Budget | None = None


class Project(BaseModel):
    object: Literal["project"] = "project"
    id: str
    name: str
    budget: Budget | None = None
    created_at: int


def _day(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).date().isoformat()


def _when(seconds: float) -> str:
    """``in 3h 20m``, ``in 6d 2h``: how long until a budget resets."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 1440)
    hours, minutes = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes}m" if hours else f"{minutes}m"


_BUDGET_WORDS = {
    "tokens_per_day": "tokens per day",
    "tokens_per_month": "tokens per month",
    "cost_per_day": "money per day",
    "cost_per_month": "money per month",
}


def _amount(budget: str, value: int) -> str:
    if not budget.startswith("cost"):
        return str(value)
    return f"{value / NANO:.9f}".rstrip("0").rstrip(".")  # exact: counted in billionths


class Budgets:
    """Budgets of keys and projects: reserved at admission, settled at the end; projects;
    spend (see the module's docstring)."""

    def __init__(self, redis: Redis, prices: Prices, metrics: Metrics | None = None) -> None:
        self.redis = redis
        self.prices = prices
        self.metrics = metrics
        self._reserve = redis.register_script(_RESERVE)
        self._settle = redis.register_script(_SETTLE)
        self._finish_and_settle = redis.register_script(_FINISH_AND_SETTLE)

    @staticmethod
    def applies(key: ApiKey) -> bool:
        """Whether a request of ``key`` reserves under a budget: the key has one of its own
        or belongs to a project (whose budget its record holds)."""
        return key.budget is not None or key.project is not None

    @staticmethod
    def _scopes(key: ApiKey) -> list[tuple[Scope, str]]:
        scopes: list[tuple[Scope, str]] = []
        if key.budget is not None:
            scopes.append(("key", key.id))
        if key.project is not None:
            scopes.append(("project", key.project))
        return scopes

    @needs_store
    async def reserve(
        self,
        admission: Admission,
        meter: Meter,
        prompt: int,
        per_generation: int,
        generations: int,
        flexible: bool,
        audio_seconds_in: float = 0.0,
    ) -> int:
        """Reserves ``prompt + generations x per_generation`` tokens (``prompt`` at most:
        :func:`prompt_bound`), and their price at the request's model's prices, under the
        budgets of the key and of its project: 429 ``budget_exceeded`` when they do not fit
        what one has left, 403 ``model_not_priced`` for a model without a price under a
        money budget. ``flexible``: fewer tokens per generation may be granted, as many as
        fit. ``audio_seconds_in``: audio whose price is reserved too (a transcription).
        Returns the tokens granted per generation."""
        key = admission.key
        model = admission.model
        price = self.prices.get(model)
        extra = round(audio_seconds_in * price.audio_input) if price else 0
        grant = per_generation
        for scope, name in self._scopes(key):
            mine = [n for r in meter.budget_reservations if r[0] == scope for n in r[1:]]
            result, cancelled = await _to_the_end(
                self._reserve(
                    keys=[counters_key(scope, name), _record(scope, name)],
                    args=[
                        prompt,
                        grant,
                        generations,
                        int(flexible),
                        price.input if price else 0,
                        price.output if price else 0,
                        extra,
                        int(price is None),
                        meter.id,
                        *mine,
                    ],
                )
            )
            if result[0] == "none":
                if cancelled:
                    raise asyncio.CancelledError
                continue
            if result[0] == "unpriced":
                whose = f"the project '{name}'" if scope == "project" else "this API key"
                raise PermissionDeniedError(
                    f"The model '{model}' has no price in the gateway's price table, and "
                    f"{whose} has a money budget: ask the operator to price it "
                    "(GATEWAY_PRICES).",
                    param="model",
                    code="model_not_priced",
                )
            if result[0] in ("no", "held"):
                raise self._refusal(key, scope, name, result[0] == "held", result[1:])
            grant = int(result[1])
            meter.budget_reservations.append(
                (scope, int(result[2]), int(result[3]), int(result[4]), int(result[5]))
            )
            self._ratios(scope, name, result[6:8])
            if cancelled:
                raise asyncio.CancelledError  # recorded: the request's settle releases it
        return grant

    def _refusal(
        self, key: ApiKey, scope: Scope, name: str, held: bool, result: list[str]
    ) -> Exception:
        budget, wait = str(result[0]), float(result[1])
        used, limit, needed = int(result[2]), int(result[3]), int(result[4])
        whose = f"project '{name}'" if scope == "project" else f"API key '{key.name}'"
        if held:
            if self.metrics is not None:
                self.metrics.budget_held.labels(scope).inc()
            reserved = int(result[5])
            return BudgetHeldError(
                f"The budget of {whose} on {_BUDGET_WORDS[budget]} is held by its requests "
                f"still running: limit {_amount(budget, limit)}, used "
                f"{_amount(budget, used)}, reserved by running requests "
                f"{_amount(budget, reserved)}, this request needs {_amount(budget, needed)}. "
                "Try again when they end (what they do not use is released).",
                scope,
            )
        if self.metrics is not None:
            self.metrics.budget_exceeded.labels(scope).inc()
        period = "day" if budget.endswith("day") else "month"
        resets = _day(time.time() + wait + 1)
        needs = f", this request needs {_amount(budget, needed)}" if needed else ""
        message = (
            f"Budget exceeded for {whose} on {_BUDGET_WORDS[budget]}: limit "
            f"{_amount(budget, limit)}, used {_amount(budget, used)}{needs}. The {period}'s "
            f"budget resets at {resets}T00:00:00Z (in {_when(wait)})."
        )
        return BudgetExceededError(message, scope, wait)

    def _ratios(self, scope: Scope, name: str, ratios: list[str]) -> None:
        if self.metrics is None:
            return
        for period, ratio in zip(("day", "month"), ratios, strict=True):
            if float(ratio) >= 0:
                self.metrics.budget_used.labels(scope, name, period).set(float(ratio))

    async def settle(
        self,
        admission: Admission,
        record: bool = True,
        finish: tuple[list[str], list[Any]] | None = None,
    ) -> None:
        """Replaces the request's reservations by what it used (nothing when ``record`` is
        false: work no client asked for) and adds its spend to the day's history of the
        key and of its project. ``finish``: the key's :data:`_FINISH` call
        (:meth:`Limits.finish_call`), run in the same script as the key's part, so a
        request ends in one script run per slot. Never raises: the response is already
        sent (a lease not released expires)."""
        key, meter, model = admission.key, admission.meter, admission.model
        used = meter.used
        price = self.prices.get(model)
        cost = price.cost(meter) if price is not None and used else 0
        date = _day(time.time())
        calls = []
        scopes: list[tuple[Scope, str | None]] = [("key", key.id), ("project", key.project)]
        for scope, name in scopes:
            if name is None:
                continue
            reservations = [r for r in meter.budget_reservations if r[0] == scope]
            keys: list[str] = []
            args: list[Any] = []
            if (used and model) or reservations:
                keys = [counters_key(scope, name), history_key(scope, name, date)]
                if scope == "project" or key.budget is not None:
                    keys.append(_record(scope, name))  # for the budget's use (a metric)
                args = [
                    meter.prompt_tokens + meter.completion_tokens,
                    cost,
                    model if used else "",
                    key.id if scope == "project" else "",
                    meter.prompt_tokens,
                    meter.completion_tokens,
                    int(record),
                    meter.id,
                    *(n for r in reservations for n in r[1:]),
                ]
            if scope == "key" and finish is not None:
                before_keys, before_args = finish
                keys = [*before_keys, *keys]
                args = [len(before_args), len(before_keys), *before_args, *args]
                calls.append(self._run(self._finish_and_settle, scope, name, keys, args))
            elif keys:
                calls.append(self._run(self._settle, scope, name, keys, args))
        await asyncio.gather(*calls)
        if self.metrics is not None and cost and record and model:
            self.metrics.spend.labels(key.project or "", model).inc(cost / NANO)

    async def _run(
        self, script: Any, scope: Scope, name: str, keys: list[str], args: list[Any]
    ) -> None:
        try:
            ratios = await script(keys=keys, args=args)
        except RedisError as exc:
            logger.warning("could not settle the request of %s %s: %s", scope, name, exc)
            return
        self._ratios(scope, name, ratios)

    # --- projects ---------------------------------------------------------------------

    @needs_store
    async def create_project(self, spec: ProjectCreate) -> Project:
        project = Project(
            id=spec.id,
            name=spec.name or spec.id,
            budget=budget_or_none(spec.budget),
            created_at=int(time.time()),
        )
        if not await self.redis.set(project_key(spec.id), project.model_dump_json(), nx=True):
            raise InvalidRequestError(
                f"A project with id '{spec.id}' exists already.",
                param="id",
                code="project_exists",
            )
        await self.redis.sadd(_PROJECTS, spec.id)
        return project

    @needs_store
    async def project(self, project_id: str, param: str | None = None) -> Project:
        """The project; 404 for an unknown one (``param``: a 400 naming it instead)."""
        raw = await self.redis.get(project_key(project_id))
        if raw is None:
            message = f"No project with id '{project_id}'."
            if param is not None:
                raise InvalidRequestError(message, param=param, code="project_not_found")
            raise NotFoundError(message, code="project_not_found")
        return Project.model_validate_json(raw)

    @needs_store
    async def update_project(self, project_id: str, change: ProjectUpdate) -> Project:
        project = await self.project(project_id)
        given = change.model_fields_set
        if "name" in given and change.name is not None:
            project.name = change.name
        if "budget" in given:
            project.budget = budget_or_none(change.budget)
        await self.redis.set(project_key(project_id), project.model_dump_json())
        return project

    @needs_store
    async def projects(self) -> list[Project]:
        ids = sorted(str(i) for i in await self.redis.smembers(_PROJECTS))
        async with self.redis.pipeline(transaction=False) as pipe:
            for project_id in ids:
                pipe.get(project_key(project_id))
            raws = await pipe.execute() if ids else []
        return [Project.model_validate_json(r) for r in raws if r]

    # --- what was spent ---------------------------------------------------------------

    @needs_store
    async def status(self, key: ApiKey) -> dict[str, Any]:
        """``/v1/me``'s ``spend`` and ``budgets``: what the key (and its project) spent
        today and this month, and each budget's use (running requests' reservations
        included) and reset."""
        now = time.time()
        today = dt.datetime.fromtimestamp(now, dt.UTC).date()
        first = today.replace(day=1)
        days = [(first + dt.timedelta(d)).isoformat() for d in range((today - first).days + 1)]
        scopes: list[tuple[Scope, str, Budget | None]] = [("key", key.id, key.budget)]
        if key.project is not None:
            project = await self.redis.get(project_key(key.project))
            budget = Project.model_validate_json(project).budget if project else None
            scopes.append(("project", key.project, budget))
        async with self.redis.pipeline(transaction=False) as pipe:
            for scope, name, _ in scopes:
                pipe.hgetall(counters_key(scope, name))
                for date in days:
                    pipe.hgetall(history_key(scope, name, date))
            answers = await pipe.execute()
        spend: dict[str, Any] = {}
        budgets: list[dict[str, Any]] = []
        step = len(days) + 1
        for index, (scope, name, budget) in enumerate(scopes):
            counters, *history = answers[index * step : (index + 1) * step]
            spend[scope] = {
                "today": _totals([history[-1]]),
                "this_month": _totals(history),
            }
            if scope == "project":
                spend[scope]["id"] = name
            budgets += _uses(scope, name, budget, counters, now)
        return {"spend": spend, "budgets": budgets}

    @needs_store
    async def spend(
        self,
        keys: list[ApiKey],
        group_by: str,
        start: dt.date,
        end: dt.date,
        key_id: str | None = None,
        project: str | None = None,
    ) -> list[dict[str, Any]]:
        """Spend from ``start`` to ``end`` (UTC days, both included), by key, project,
        model or day; ``key_id`` or ``project``: that key's or project's only. A project's
        figures come from its own history (by key and model), anyone else's from the keys'
        (``keys``: every key, the bootstrap admin key's ``admin`` too)."""
        dates = [(start + dt.timedelta(d)).isoformat() for d in range((end - start).days + 1)]
        by_project = project is not None or group_by == "project"
        if by_project:
            names = [project] if project else [p.id for p in await self.projects()]
            scope: Scope = "project"
        else:
            names = [key_id] if key_id else [k.id for k in keys]
            scope = "key"
        wanted = [history_key(scope, name, date) for name in names for date in dates]
        answers: list[dict[str, str]] = []
        for at in range(0, len(wanted), _BATCH):  # bounded pipelines, however many keys
            async with self.redis.pipeline(transaction=False) as pipe:
                for history in wanted[at : at + _BATCH]:
                    pipe.hgetall(history)
                answers += await pipe.execute()
        groups: dict[str, dict[str, int]] = {}
        for index, raw in enumerate(answers):
            if not raw:
                continue
            name, date = names[index // len(dates)], dates[index % len(dates)]
            if group_by in ("model", "key") and not (group_by == "key" and scope == "key"):
                kind = "m" if group_by == "model" else "k"
                for field, value in raw.items():
                    prefix, _, rest = str(field).partition(":")
                    what, _, label = rest.partition(":")
                    if prefix == kind:
                        _add(groups, label, what, int(value))
                continue
            label = date if group_by == "day" else name
            for what in ("requests", "prompt_tokens", "completion_tokens", "cost"):
                _add(groups, label, what, int(raw.get(what, 0)))
        names_of = {k.id: k for k in keys}
        rows = []
        for label, totals in sorted(groups.items()):
            row: dict[str, Any] = {group_by: label, **_row(totals)}
            if group_by == "key" and label in names_of:
                row["name"] = names_of[label].name
                row["project"] = names_of[label].project
            rows.append(row)
        return rows


def _add(groups: dict[str, dict[str, int]], label: str, what: str, value: int) -> None:
    totals = groups.setdefault(label, {})
    totals[what] = totals.get(what, 0) + value


def _row(totals: dict[str, int]) -> dict[str, Any]:
    prompt, completion = totals.get("prompt_tokens", 0), totals.get("completion_tokens", 0)
    return {
        "requests": totals.get("requests", 0),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "cost": totals.get("cost", 0) / NANO,
    }


def _totals(history: list[dict[str, str]]) -> dict[str, Any]:
    totals: dict[str, int] = {}
    for raw in history:
        for what in ("requests", "prompt_tokens", "completion_tokens", "cost"):
            _add({"": totals}, "", what, int(raw.get(what, 0)))
    return _row(totals)


def _uses(
    scope: Scope, name: str, budget: Budget | None, counters: dict[str, str], now: float
) -> list[dict[str, Any]]:
    """Each budget of a scope: its limit, what settled requests used of it, what running
    ones have reserved, when it resets."""
    if budget is None:
        return []
    today = dt.datetime.fromtimestamp(now, dt.UTC).date()
    day = (today - dt.date(1970, 1, 1)).days
    month = today.year * 12 + today.month - 1
    now_of = {"day": str(day), "month": str(month)}
    next_month = (today.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    resets = {"day": today + dt.timedelta(days=1), "month": next_month}
    uses = []
    for field, limit in budget.model_dump(exclude_none=True).items():
        unit, _, period = field.partition("_per_")
        # Each counted in its own period, as the scripts read them (_COMMON).
        current = counters.get(period) == now_of[period]
        held_current = counters.get(f"held_{period}") == now_of[period]
        used = _counted(counters, f"{period}_{unit}", unit) if current else 0
        reserved = _counted(counters, f"held_{period}_{unit}", unit) if held_current else 0
        uses.append(
            {
                "scope": scope,
                "id": name,
                "budget": field,
                "limit": limit,
                "used": used,
                "reserved": reserved,
                "remaining": max(limit - used - reserved, 0),
                "resets_at": f"{resets[period].isoformat()}T00:00:00Z",
            }
        )
    return uses


def _counted(counters: dict[str, str], field: str, unit: str) -> float:
    counted = int(counters.get(field, 0))
    return counted / NANO if unit == "cost" else counted
