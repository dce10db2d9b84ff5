"""The admin API (admin role): the Triton repository and model control, API keys, usage,
and the audit log of what admins did (each route that changes something records itself:
:mod:`gateway.api.audit`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query

from gateway.api.audit import AuditDep
from gateway.api.auth import require_admin
from gateway.api.dependencies import ServicesDep
from gateway.state.audit import MAX_PAGE
from gateway.state.keys import ApiKey, CreatedKey, KeyCreate, KeyUpdate
from gateway.state.projects import Project, ProjectCreate, ProjectUpdate

# The admin role is required here too, not only where app.py includes this router: no other
# place that includes it can expose key creation (FastAPI runs the dependency once).
router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])


@router.get("/models")
async def repository(services: ServicesDep) -> dict[str, Any]:
    """Every model in Triton's repository with its state: ``status`` (``ready``,
    ``failed``, ``loading``, ``unloading``, ``unloaded``, ``not_loaded``), Triton's
    ``state`` (``READY``, ``UNAVAILABLE``...) and ``reason`` (why a load failed)."""
    return {"object": "list", "data": await services.admin.repository()}


@router.post("/models/{name}/load")
async def load_model(name: str, services: ServicesDep, audit: AuditDep) -> dict[str, Any]:
    """Loads (or reloads) a model; it appears in ``/v1/models`` when this returns."""
    async with audit("model.load", name):
        return await services.admin.load(name)


@router.post("/models/{name}/unload")
async def unload_model(name: str, services: ServicesDep, audit: AuditDep) -> dict[str, Any]:
    """Unloads a model; it leaves ``/v1/models`` when this returns."""
    async with audit("model.unload", name):
        return await services.admin.unload(name)


@router.post("/keys", status_code=201)
async def create_key(spec: KeyCreate, services: ServicesDep, audit: AuditDep) -> CreatedKey:
    """Creates a key. The answer's ``key`` is the only time it is shown."""
    asked = spec.model_dump(exclude_none=True)
    async with audit("key.create", details=asked) as action:
        created = await services.admin.create_key(spec)
        action.target = created.id
        return created


@router.get("/keys")
async def list_keys(services: ServicesDep) -> dict[str, Any]:
    return {"object": "list", "data": await services.keys.all()}


@router.get("/keys/{key_id}")
async def get_key(key_id: str, services: ServicesDep) -> ApiKey:
    return await services.keys.get(key_id)


@router.delete("/keys/{key_id}")
async def revoke_key(key_id: str, services: ServicesDep, audit: AuditDep) -> ApiKey:
    """Revokes a key at once (idempotent). Its record and usage stay."""
    async with audit("key.revoke", key_id):
        return await services.keys.revoke(key_id)


@router.get("/keys/{key_id}/usage")
async def key_usage(key_id: str, services: ServicesDep) -> dict[str, Any]:
    """What the key has used: requests, prompt and completion tokens, audio seconds."""
    return await services.admin.usage(key_id)


@router.get("/batches")
async def running_batches(services: ServicesDep) -> dict[str, Any]:
    """Every batch not yet ended, whoever's key made it (``owner``: its id): the operator's
    view of the batch work (docs/batches.md)."""
    return {"object": "list", "data": await services.batches.running()}


@router.get("/audit")
async def audit_log(
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    after: str | None = None,
) -> dict[str, Any]:
    """What admins did, newest first: who, when, what, from where (two entries per action:
    ``requested``, then ``completed`` or ``failed``), paginated as OpenAI lists are
    (``after``: the last id of the previous page)."""
    entries, more = await services.audit.page(limit, after)
    return {
        "object": "list",
        "data": entries,
        "first_id": entries[0].id if entries else None,
        "last_id": entries[-1].id if entries else None,
        "has_more": more,
    }


@router.patch("/keys/{key_id}")
async def update_key(
    key_id: str, change: KeyUpdate, services: ServicesDep, audit: AuditDep
) -> ApiKey:
    """Sets a key's project, budget or priority (docs/budgets.md, docs/scheduling.md);
    ``null`` clears one."""
    async with audit("key.update", key_id, change.model_dump(exclude_unset=True)):
        return await services.admin.update_key(key_id, change)


@router.post("/projects", status_code=201)
async def create_project(spec: ProjectCreate, services: ServicesDep, audit: AuditDep) -> Project:
    """Creates a project (docs/budgets.md): keys join it with ``project``."""
    async with audit("project.create", spec.id, spec.model_dump(exclude_none=True)):
        return await services.projects.create(spec)


@router.get("/projects")
async def list_projects(services: ServicesDep) -> dict[str, Any]:
    return {"object": "list", "data": await services.projects.all()}


@router.get("/projects/{project_id}")
async def get_project(project_id: str, services: ServicesDep) -> Project:
    return await services.projects.get(project_id)


@router.patch("/projects/{project_id}")
async def update_project(
    project_id: str, change: ProjectUpdate, services: ServicesDep, audit: AuditDep
) -> Project:
    """Sets a project's name or budget; ``"budget": null`` clears it."""
    async with audit("project.update", project_id, change.model_dump(exclude_unset=True)):
        return await services.projects.update(project_id, change)


@router.get("/spend")
async def spend(
    services: ServicesDep,
    group_by: Literal["key", "project", "model", "day"] = "day",
    start: str | None = None,
    end: str | None = None,
    key_id: str | None = None,
    project: str | None = None,
) -> dict[str, Any]:
    """Requests, tokens and money spent (at ``GATEWAY_PRICES``) from ``start`` to ``end``
    (UTC days ``YYYY-MM-DD``, both included; this month by default; at most 92 days),
    grouped by key, project, model or day; ``key_id`` or ``project``: theirs only."""
    return await services.admin.spend(group_by, start, end, key_id, project)
