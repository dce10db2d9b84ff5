"""Budgets of keys and projects (docs/budgets.md), held in Redis so that every replica
enforces one figure.

A key may belong to a project; a key and a project may each have budgets in tokens
(prompt + completion) or in money (at the prices of ``GATEWAY_PRICES``), per calendar day
and per calendar month in UTC (Redis's clock). Each scope (a key, a project) keeps its
period's counters in one hash, and one Lua script run per scope reserves or settles, so
the check and the increment cannot interleave between replicas:

- **Reserve** (``lua/budget_reserve.lua``, at the start of the work, with the token reservation of
  ``tpm``): the prompt at most one token per UTF-8 byte (no tokenizer makes more from text;
  one more for the begin-of-sequence token an engine may add) plus ``n x max_tokens``, or
  their price, must fit what every budget of the scope has left, else 429
  ``budget_exceeded`` naming when the period resets. What running requests have reserved
  is held apart from what ended ones used: a request that would fit but for it gets a 429
  ``budget_held`` the SDKs retry. A request with no ``max_tokens`` is given what is left.
  Work that cannot be sized beforehand (speech; a transcription's money is, from its
  duration) is refused once a budget is spent and counted when it ends.
- **Settle** (``lua/budget_settle.lua``, when the response has been sent, whatever its outcome):
  the reservations are released and replaced by what the request used, in the period they
  were taken in; a request that failed used nothing, so its reservation is released. The spend is
  added to the scope's history of the day (by model; a project's by key too), which
  ``GET /admin/spend`` and ``/v1/me`` read (:mod:`gateway.state.spend`). A key's settle
  runs in one script with the end of its rate limits (``lua/finish_and_settle.lua``).

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

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.config import ModelPrice
from gateway.errors import BudgetExceededError, BudgetHeldError, PermissionDeniedError
from gateway.state.keys import ApiKey, record_key
from gateway.state.limits import Meter
from gateway.state.projects import project_key
from gateway.state.redis import PREFIX, needs_store
from gateway.state.scripts import register

if TYPE_CHECKING:
    from gateway.metrics import Metrics

logger = logging.getLogger("gateway.state.budgets")

#: Money is counted in billionths of the price table's unit.
NANO = 1_000_000_000
#: How long a day's spend history is kept.
HISTORY_DAYS = 400

Scope = Literal["key", "project"]


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
    """Budgets of keys and projects: reserved at admission, settled at the end (see the
    module's docstring)."""

    def __init__(self, redis: Redis, prices: Prices, metrics: Metrics | None = None) -> None:
        self.redis = redis
        self.prices = prices
        self.metrics = metrics
        self._reserve = register(redis, "budget_reserve")
        history_s = HISTORY_DAYS * 86400
        self._settle = register(redis, "budget_settle", HISTORY_S=history_s)
        self._finish_and_settle = register(redis, "finish_and_settle", HISTORY_S=history_s)

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
        key: ApiKey,
        model: str,
        meter: Meter,
        prompt: int,
        per_generation: int,
        generations: int,
        flexible: bool,
        audio_seconds_in: float = 0.0,
    ) -> int:
        """Reserves ``prompt + generations x per_generation`` tokens (``prompt`` at most:
        :func:`prompt_bound`), and their price at ``model``'s prices, under the
        budgets of ``key`` and of its project: 429 ``budget_exceeded`` when they do not fit
        what one has left, 403 ``model_not_priced`` for a model without a price under a
        money budget. ``flexible``: fewer tokens per generation may be granted, as many as
        fit. ``audio_seconds_in``: audio whose price is reserved too (a transcription).
        Returns the tokens granted per generation."""
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
        key: ApiKey,
        model: str,
        meter: Meter,
        record: bool = True,
        finish: tuple[list[str], list[Any]] | None = None,
    ) -> None:
        """Replaces the reservations of ``key``'s request by what it used (``meter``, under
        ``model``; nothing when ``record`` is false: work no client asked for) and adds its
        spend to the day's history of the key and of its project. ``finish``: the key's
        ``limits_finish.lua`` call (:meth:`Limits.finish_call`), run in the same script as
        the key's part, so a request ends in one script run per slot. Never raises: the
        response is already sent (a lease not released expires)."""
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
