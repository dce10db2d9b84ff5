"""/v1/batches: create (from an uploaded JSONL file), retrieve, list, cancel (the caller's
own; another key's batch is a 404). The work runs on every replica's batch worker."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from gateway.api.audit import KeyAuditDep
from gateway.api.auth import CallerDep, PresentedKey
from gateway.api.dependencies import ServicesDep
from gateway.serving.batches import BatchCreate
from gateway.state.keys import hash_key

router = APIRouter(prefix="/v1/batches", tags=["batches"])


@router.post("")
async def create_batch(
    body: BatchCreate,
    caller: CallerDep,
    presented: PresentedKey,
    services: ServicesDep,
    audit: KeyAuditDep,
) -> dict[str, Any]:
    asked = {"input_file_id": body.input_file_id, "endpoint": body.endpoint}
    async with audit("batch.create", None, asked) as action:
        # The key's hash, as a client secret holds it: each line is admitted as the key is.
        made = await services.batches.create(caller, hash_key(presented or ""), body)
        action.target = made["id"]
        action.details["status"] = made["status"]
        return made


@router.get("")
async def list_batches(
    caller: CallerDep,
    services: ServicesDep,
    after: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    return await services.batches.list(caller.id, after, limit)


@router.get("/{batch_id}")
async def retrieve_batch(batch_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    return await services.batches.get(caller.id, batch_id)


@router.post("/{batch_id}/cancel")
async def cancel_batch(
    batch_id: str, caller: CallerDep, services: ServicesDep, audit: KeyAuditDep
) -> dict[str, Any]:
    async with audit("batch.cancel", batch_id):
        return await services.batches.cancel(caller.id, batch_id)
