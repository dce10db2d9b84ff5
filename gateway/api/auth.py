"""Who is calling, and may they: the dependencies every ``/v1`` and ``/admin`` route uses.

- :data:`CallerDep`: the key's metadata from ``Authorization: Bearer <key>`` (401 without a
  valid key).
- :func:`require_admin`: the same, 403 unless the key has the admin role.
- :data:`AdmissionDep`: for inference routes: admits the request under the key's rate
  limits (429 over them); the route names its model with
  :meth:`~gateway.state.admission.Admission.use_model` (403 if the key may not use it) and hands
  the returned meter to its service.

An admitted request's lease, tokens and usage are settled by ``GatewayMiddleware``
once the response has been sent, streamed bodies included, and the ``x-ratelimit-*``
headers are added to its response there (:mod:`gateway.api.middleware`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.api.dependencies import ServicesDep
from gateway.api.middleware import ADMISSION
from gateway.errors import PermissionDeniedError
from gateway.state.admission import Admission
from gateway.state.keys import ApiKey

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer sk-gw-...`")


async def _caller(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    services: ServicesDep,
) -> ApiKey:
    return await services.gatekeeper.check(credentials.credentials if credentials else None)


CallerDep = Annotated[ApiKey, Depends(_caller)]


async def require_admin(caller: CallerDep) -> ApiKey:
    """403 unless the key has the admin role."""
    if not caller.is_admin:
        raise PermissionDeniedError("This endpoint needs an API key with the admin role.")
    return caller


async def metrics_access(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    services: ServicesDep,
) -> None:
    """``/metrics`` is open unless ``GATEWAY_METRICS_REQUIRE_KEY`` asks for an admin key."""
    if services.settings.metrics_require_key:
        await require_admin(await _caller(credentials, services))


async def _admitted(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    services: ServicesDep,
) -> Admission:
    """The key check and the admission in one Redis round trip."""
    admission = await services.gatekeeper.admit(credentials.credentials if credentials else None)
    setattr(request.state, ADMISSION, admission)
    return admission


AdmissionDep = Annotated[Admission, Depends(_admitted)]
