"""Who is calling, and may they. ``app.py`` states the rule for every route at once, where
the routers are included: each ``/v1`` route is admitted (:func:`admit`), each ``/admin``
route takes the key check alone and the admin role (:func:`require_admin`); ``/metrics``
has its own rule (:func:`metrics_access`); the others (``/health``, the playground page,
FastAPI's docs) are open.

- :func:`admit`: the key (``Authorization: Bearer <key>``; on a WebSocket also the
  subprotocol ``openai-insecure-api-key.<key>``, all a browser can send) checked and the
  request admitted under the key's rate limits, in one Redis round trip (401 without a
  valid key, 429 over a limit): every request counts against ``rpm`` and concurrency, as
  OpenAI counts them. A WebSocket is admitted once, before the upgrade, and holds its
  concurrency slot while it is open. A WebSocket may present a Realtime client secret
  (``ek_...``) instead: it is admitted as the key that created the secret
  (:func:`_admit_client_secret`); :data:`ClientSecretDep` hands it to the route, which
  uses it up once the session is open. A client secret anywhere else is a 401.
- :data:`AdmissionDep`: that admission, for a route that uses a model: it names it with
  :meth:`~gateway.state.admission.Admission.use_model` (403 if the key may not use it) and
  hands the returned meter to its service. :data:`CallerDep`: the admitted key's metadata.
- :data:`ReadmitDep`: admits further requests of the same caller, each under the key's
  limits as they are then, without a concurrency slot of their own: a Realtime session's
  responses and transcriptions (the session never sees the key).
- :func:`require_admin`: the key checked, not admitted (an operator's calls do not count),
  403 unless it has the admin role.

An admitted request's lease, tokens and usage are settled by ``GatewayMiddleware``
once the response has been sent, streamed bodies included, and the ``x-ratelimit-*``
headers are added to its response there (:mod:`gateway.api.middleware`).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from gateway.api.dependencies import ServicesDep
from gateway.api.middleware import ADMISSION
from gateway.backend import scheduling
from gateway.errors import PermissionDeniedError
from gateway.serving.batches import BATCH_CALLER, BatchCaller
from gateway.serving.realtime import Admit
from gateway.state.admission import Admission
from gateway.state.client_secrets import ClientSecret, is_client_secret
from gateway.state.keys import ApiKey
from gateway.tracing import span

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer sk-gw-...`")

Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


#: The subprotocol a browser's WebSocket carries the key in (OpenAI's name).
_KEY_PROTOCOL = "openai-insecure-api-key."


def _presented(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials else None


async def _key(connection: HTTPConnection, credentials: Credentials) -> str | None:
    """The key the caller presented, if any: ``Authorization: Bearer``, else Anthropic's
    ``x-api-key`` header (what the Anthropic SDKs and Claude Code send)."""
    if credentials:
        return _presented(credentials)
    if api_key := connection.headers.get("x-api-key"):
        return api_key
    protocols: list[str] = connection.scope.get("subprotocols", [])  # WebSockets only
    for protocol in protocols:
        if protocol.startswith(_KEY_PROTOCOL):
            return protocol.removeprefix(_KEY_PROTOCOL)
    return None


PresentedKey = Annotated[str | None, Depends(_key)]


async def admit(
    connection: HTTPConnection, presented: PresentedKey, services: ServicesDep
) -> Admission:
    """The key check and the admission in one Redis round trip; the middleware settles the
    admission when the response has been sent (a WebSocket's when it closes)."""
    with span("redis.admission", _ADMISSION_ATTRIBUTES) as traced:
        batch = connection.scope.get(BATCH_CALLER)
        if isinstance(batch, BatchCaller):  # a batch's request, from this process only
            admission = await services.gatekeeper.admit_as(batch.key_id, batch.key_hash)
        elif connection.scope["type"] == "websocket" and is_client_secret(presented):
            admission = await _admit_client_secret(connection, presented, services)
        else:
            admission = await services.gatekeeper.admit(presented)
        if traced is not None:
            traced.set_attribute("gateway.key.id", admission.key.id)
            traced.set_attribute("gateway.outcome", "admitted")
    setattr(connection.state, ADMISSION, admission)
    # The key's priority for every backend call of the request (a route that takes a
    # request's own priority or a conversation's key sets its dispatch again).
    scheduling.admitted(admission.key.project or f"key:{admission.key.id}")
    scheduling.start(admission.key.request_priority(None))
    return admission


#: Where :func:`admit` leaves the client secret a WebSocket was opened with.
CLIENT_SECRET = "client_secret"


async def _admit_client_secret(
    connection: HTTPConnection, presented: str, services: ServicesDep
) -> Admission:
    """A client secret's connection, admitted as the key that created the secret (as that
    key is now: revoked since, a 401). The secret is only read here: the route uses it up
    (:meth:`~gateway.state.client_secrets.ClientSecretStore.consume`) once the session is
    open, so that a refusal before (429 over a limit, a bad parameter) leaves it usable;
    of two connections presenting it, one gets past ``consume``, the other a 401."""
    secret = await services.realtime_secrets.store.find(presented)
    admission = await services.gatekeeper.admit_as(secret.owner, secret.key_hash)
    setattr(connection.state, ADMISSION, admission)  # settled even if the route refuses
    setattr(connection.state, CLIENT_SECRET, secret)
    return admission


#: The admission's span (traces on): one Lua script in Redis (none for the bootstrap key).
_ADMISSION_ATTRIBUTES = {"db.system.name": "redis", "db.operation.name": "EVALSHA"}


AdmissionDep = Annotated[Admission, Depends(admit)]


async def _client_secret(
    connection: HTTPConnection, admission: AdmissionDep
) -> ClientSecret | None:
    """The client secret the WebSocket was admitted with, if it was (``admission``: read
    once :func:`admit` has run)."""
    secret = getattr(connection.state, CLIENT_SECRET, None)
    return secret if isinstance(secret, ClientSecret) else None


ClientSecretDep = Annotated[ClientSecret | None, Depends(_client_secret)]


async def _readmit(
    presented: PresentedKey, secret: ClientSecretDep, services: ServicesDep
) -> Admit:
    if secret is not None:  # the session's requests are the creating key's
        return partial(
            services.gatekeeper.admit_as, secret.owner, secret.key_hash, hold_lease=False
        )
    return partial(services.gatekeeper.admit, presented, hold_lease=False)


ReadmitDep = Annotated[Admit, Depends(_readmit)]


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
