"""Admin actions into the audit log (:mod:`gateway.state.audit`). A route that changes
something takes :data:`AuditDep` (an :class:`~gateway.state.audit.Auditor` with the caller
and the client bound) and wraps the change in one line::

    @router.delete("/keys/{key_id}")
    async def revoke_key(key_id: str, services: ServicesDep, audit: AuditDep) -> ApiKey:
        async with audit("key.revoke", key_id):
            return await services.keys.revoke(key_id)

The ``requested`` entry is written before the block runs (503, and the block does not run,
when it cannot be); ``completed`` or ``failed`` after it. The block may complete what the
log says: ``action.target = created.id``, ``action.details[...] = ...``.

:data:`KeyAuditDep` is the same for a key's own actions the log records (any key: a batch
made or cancelled).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import Request

from gateway.api.auth import CallerDep, require_admin
from gateway.api.dependencies import ServicesDep
from gateway.errors import request_id
from gateway.state.audit import Actor, Auditor
from gateway.state.keys import ApiKey


async def _auditor(
    request: Request, caller: Annotated[ApiKey, Depends(require_admin)], services: ServicesDep
) -> Auditor:
    client = request.client.host if request.client else None
    actor = Actor(id=caller.id, name=caller.name)
    return Auditor(services.audit, actor, client, request_id(request))


AuditDep = Annotated[Auditor, Depends(_auditor)]


async def _key_auditor(request: Request, caller: CallerDep, services: ServicesDep) -> Auditor:
    """The auditor of a key's own action that the log records (a batch made or cancelled):
    the caller is whichever key it is, admitted as for any ``/v1`` route; only what was done
    is written (a key's refused attempts would flood the admins' log)."""
    client = request.client.host if request.client else None
    actor = Actor(id=caller.id, name=caller.name)
    return Auditor(services.audit, actor, client, request_id(request), done_only=True)


KeyAuditDep = Annotated[Auditor, Depends(_key_auditor)]
