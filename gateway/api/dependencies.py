"""The one dependency that hands the services to routes: :data:`ServicesDep`, the
:class:`~gateway.services.Services` the lifespan built. A route takes ``services:
ServicesDep`` and calls ``services.chat``, ``services.catalog``...; the type checker knows
each of them, and there is one place (this getter) that reads ``app.state``.

It is ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in a worker thread,
and the hand-off to and from that thread cost more CPU than the rest of a request's
dependencies together (seen with py-spy). It takes an ``HTTPConnection``, so WebSocket
routes use it too."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection
from starlette.types import Scope

from gateway.services import Services


def services_of(scope: Scope) -> Services:
    """The services of the app serving ``scope`` (the middleware reads them so)."""
    services: Services = scope["app"].state.services
    return services


async def _services(connection: HTTPConnection) -> Services:
    return services_of(connection.scope)


ServicesDep = Annotated[Services, Depends(_services)]
