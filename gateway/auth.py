"""Who is calling, and may they: the dependencies every ``/v1`` and ``/admin`` route uses.

- :data:`CallerDep`: the key's metadata from ``Authorization: Bearer <key>`` (401 without a
  valid key).
- :func:`require_admin`: the same, 403 unless the key has the admin role.
- :data:`AdmissionDep`: for inference routes: admits the request under the key's rate
  limits (429 over them); the route names its model with
  :meth:`~gateway.ratelimit.Admission.use_model` (403 if the key may not use it) and hands
  the returned meter to its service.

An admitted request's lease, tokens and usage are settled by :class:`AdmissionMiddleware`
once the response has been sent, streamed bodies included, and the ``x-ratelimit-*``
headers are added to its response there.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import PermissionDeniedError
from gateway.keys import ApiKey, KeyStore
from gateway.ratelimit import Admission, RateLimiter

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer sk-gw-...`")

_ADMISSION = "admission"


async def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    keys: KeyStore = request.app.state.keys
    return await keys.authenticate(credentials.credentials if credentials else None)


CallerDep = Annotated[ApiKey, Depends(_caller)]


async def require_admin(caller: CallerDep) -> ApiKey:
    """403 unless the key has the admin role."""
    if not caller.is_admin:
        raise PermissionDeniedError("This endpoint needs an API key with the admin role.")
    return caller


async def metrics_access(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """``/metrics`` is open unless ``GATEWAY_METRICS_REQUIRE_KEY`` asks for an admin key."""
    if request.app.state.settings.metrics_require_key:
        await require_admin(await _caller(request, credentials))


async def _admitted(request: Request, caller: CallerDep) -> Admission:
    limiter: RateLimiter = request.app.state.limiter
    admission = await limiter.admit(caller)
    request.state.admission = admission
    return admission


AdmissionDep = Annotated[Admission, Depends(_admitted)]


class AdmissionMiddleware:
    """Adds an admitted request's rate-limit headers to its response and settles the
    admission (lease, tokens, usage) after the last byte of the body, or when the client
    went away."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # request.state is this dict (Starlette keeps it in the scope).
        state = scope.setdefault("state", {})

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                admission: Admission | None = state.get(_ADMISSION)
                if admission is not None and admission.headers:
                    headers = MutableHeaders(scope=message)
                    for name, value in admission.headers.items():
                        headers[name] = value
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            admission = state.get(_ADMISSION)
            if admission is not None:
                limiter: RateLimiter = scope["app"].state.limiter
                # Shielded: a cancelled request still releases its slot and counts its usage.
                await asyncio.shield(limiter.finish(admission))
