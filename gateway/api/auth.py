"""Who is calling, and may they. ``app.py`` states the rule for every route at once, where
the routers are included: each ``/v1`` route is admitted (:func:`admit`), each ``/admin``
route takes the key check alone and the admin role (:func:`require_admin`); the others
(``/health``, ``/metrics``, the playground page) are open.

- :func:`admit`: the key (``Authorization: Bearer <key>``) checked and the request admitted
  under the key's rate limits, in one Redis round trip (401 without a valid key, 429 over
  a limit): every request counts against ``rpm`` and concurrency, as OpenAI counts them.
- :data:`AdmissionDep`: that admission, for a route that uses a model: it names it with
  :meth:`~gateway.state.admission.Admission.use_model` (403 if the key may not use it) and
  hands the returned meter to its service. :data:`CallerDep`: the admitted key's metadata.
- :func:`require_admin`: the key checked, not admitted (an operator's calls do not count),
  403 unless it has the admin role.

An admitted request's lease, tokens and usage are settled by ``GatewayMiddleware``
once the response has been sent, streamed bodies included, and the ``x-ratelimit-*``
headers are added to its response there (:mod:`gateway.api.middleware`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from gateway.api.dependencies import ServicesDep
from gateway.api.middleware import ADMISSION
from gateway.errors import PermissionDeniedError
from gateway.state.admission import Admission
from gateway.state.keys import ApiKey

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer sk-gw-...`")

Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _presented(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials else None


async def admit(
    connection: HTTPConnection, credentials: Credentials, services: ServicesDep
) -> Admission:
    """The key check and the admission in one Redis round trip; the middleware settles the
    admission when the response has been sent."""
    admission = await services.gatekeeper.admit(_presented(credentials))
    setattr(connection.state, ADMISSION, admission)
    return admission


AdmissionDep = Annotated[Admission, Depends(admit)]


async def _caller(admission: AdmissionDep) -> ApiKey:
    return admission.key


CallerDep = Annotated[ApiKey, Depends(_caller)]


async def _checked(credentials: Credentials, services: ServicesDep) -> ApiKey:
    """The key checked, not admitted: 401 without a valid key."""
    return await services.gatekeeper.check(_presented(credentials))


async def require_admin(caller: Annotated[ApiKey, Depends(_checked)]) -> ApiKey:
    """403 unless the key has the admin role."""
    if not caller.is_admin:
        raise PermissionDeniedError("This endpoint needs an API key with the admin role.")
    return caller


async def metrics_access(credentials: Credentials, services: ServicesDep) -> None:
    """``/metrics`` is open unless ``GATEWAY_METRICS_REQUIRE_KEY`` asks for an admin key."""
    if services.settings.metrics_require_key:
        await require_admin(await _checked(credentials, services))
