"""What keys and projects spent (docs/budgets.md): ``/v1/me``'s ``spend`` and ``budgets``,
and ``GET /admin/spend``'s report, read from the day's histories and the budget counters
that :mod:`gateway.state.budgets` writes when a request is settled.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from redis.asyncio import Redis

from gateway.state.budgets import NANO, Scope, counters_key, history_key
from gateway.state.keys import ApiKey, Budget
from gateway.state.projects import Project, ProjectStore, project_key
from gateway.state.redis import needs_store

#: The longest range ``GET /admin/spend`` reads at once, in days.
MAX_SPEND_DAYS = 92
#: Commands in one pipeline of ``GET /admin/spend``.
_BATCH = 1000


class Spend:
    """The spend reports (see the module's docstring)."""

    def __init__(self, redis: Redis, projects: ProjectStore) -> None:
        self.redis = redis
        self.projects = projects

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
    async def report(
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
            names = [project] if project else [p.id for p in await self.projects.all()]
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
