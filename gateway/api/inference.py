"""Which routes serve inference: each is marked where it is declared (:func:`inference`),
and the middleware names them in its metrics and spans by their path (the others by
their group, ``/v1``, ``/admin``...: a bounded set of labels)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from starlette.routing import BaseRoute

_MARK = "gateway_inference"

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def inference(endpoint: Endpoint) -> Endpoint:
    """Marks a route's endpoint as serving inference (put it under the route's decorator)."""
    setattr(endpoint, _MARK, True)
    return endpoint


def inference_paths(routes: Iterable[BaseRoute]) -> frozenset[str]:
    """The paths of the marked routes."""
    return frozenset(
        str(getattr(route, "path", ""))
        for route in routes
        if getattr(getattr(route, "endpoint", None), _MARK, False)
    )
