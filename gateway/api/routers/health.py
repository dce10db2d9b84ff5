"""Liveness and readiness probes (no authentication, no /v1 prefix)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway import outages
from gateway.api.dependencies import ServicesDep
from gateway.errors import BackendUnavailableError

router = APIRouter(prefix="/health", tags=["health"])


@router.get("/live")
async def live() -> dict[str, str]:
    """The gateway process answers."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(services: ServicesDep) -> dict[str, object]:
    """Redis answers, Triton is up and every model named in ``GATEWAY_MODELS`` is loaded;
    503 otherwise: at once, never waiting for a backend coming back (a probe wants the
    answer of now)."""
    outages.begin(0.0)
    await services.redis_health.check()  # 503 when Redis does not answer
    if not await services.backend.ready():
        raise BackendUnavailableError("Triton is not ready", code="not_ready")
    models = await services.catalog.refresh()
    wanted = services.settings.models
    missing = [m for m in wanted if m not in models or not models[m].ready]
    if missing:
        raise BackendUnavailableError(f"Models not ready: {', '.join(missing)}", code="not_ready")
    return {"status": "ready", "models": wanted}
