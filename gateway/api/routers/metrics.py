"""GET /metrics: the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.api.auth import metrics_access
from gateway.api.dependencies import ServicesDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, dependencies=[Depends(metrics_access)])
async def metrics(services: ServicesDep) -> Response:
    """Open, or admin-only with ``GATEWAY_METRICS_REQUIRE_KEY``."""
    body, content_type = services.metrics.render()
    return Response(body, media_type=content_type)
