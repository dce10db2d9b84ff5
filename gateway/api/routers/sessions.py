"""GET and DELETE /v1/sessions/{id}: the caller's stored conversations."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.api.auth import CallerDep
from gateway.api.dependencies import ServicesDep

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


@router.get("/{session_id}")
async def get_session(session_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    """The session's messages (system message first); 404 if it is not the caller's."""
    return (await services.sessions.get(session_id, caller.id)).public()


@router.delete("/{session_id}")
async def delete_session(
    session_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    await services.sessions.delete(session_id, caller.id)
    return {"id": session_id, "object": "chat.session.deleted", "deleted": True}
