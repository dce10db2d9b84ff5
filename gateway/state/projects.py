"""Projects (docs/budgets.md): a group of API keys with a budget of its own, its record
held in Redis (``gw:project:{<id>}``, the project's id as its Redis Cluster hash tag) and
listed in one set. A key names its project in its record; the budget's counters and the
spend history are :mod:`gateway.state.budgets` and :mod:`gateway.state.spend`.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from gateway.errors import InvalidRequestError, NotFoundError
from gateway.state.keys import PROJECT_ID, Budget, budget_or_none
from gateway.state.redis import PREFIX, needs_store

_PROJECTS = f"{PREFIX}projects"


def project_key(project_id: str) -> str:
    """A project's record (its name and budget, as JSON)."""
    return f"{PREFIX}project:{{{project_id}}}"


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
    """A project's record, as the admin API returns it."""

    object: Literal["project"] = "project"
    id: str
    name: str
    budget: Budget | None = None
    created_at: int


class ProjectStore:
    """Projects' records: created, read, changed and listed by the admin API."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    @needs_store
    async def create(self, spec: ProjectCreate) -> Project:
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
    async def get(self, project_id: str, param: str | None = None) -> Project:
        """The project; 404 for an unknown one (``param``: a 400 naming it instead)."""
        raw = await self.redis.get(project_key(project_id))
        if raw is None:
            message = f"No project with id '{project_id}'."
            if param is not None:
                raise InvalidRequestError(message, param=param, code="project_not_found")
            raise NotFoundError(message, code="project_not_found")
        return Project.model_validate_json(raw)

    @needs_store
    async def update(self, project_id: str, change: ProjectUpdate) -> Project:
        project = await self.get(project_id)
        given = change.model_fields_set
        if "name" in given and change.name is not None:
            project.name = change.name
        if "budget" in given:
            project.budget = budget_or_none(change.budget)
        await self.redis.set(project_key(project_id), project.model_dump_json())
        return project

    @needs_store
    async def all(self) -> list[Project]:
        ids = sorted(str(i) for i in await self.redis.smembers(_PROJECTS))
        async with self.redis.pipeline(transaction=False) as pipe:
            for project_id in ids:
                pipe.get(project_key(project_id))
            raws = await pipe.execute() if ids else []
        return [Project.model_validate_json(r) for r in raws if r]
