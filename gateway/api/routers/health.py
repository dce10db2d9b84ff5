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
    """Whether this replica can serve: Redis answers, Triton answers (is live) and every
    model named in ``GATEWAY_MODELS`` is ready; 503 otherwise: at once, never waiting for a
    backend coming back (a probe wants the answer of now).

    Any other model of Triton's repository, one that failed to load included, changes
    nothing here (it shows in ``/admin/models`` and ``gateway_model_ready``): it is the
    same for every replica, and taking them all out of rotation would only stop the models
    that serve. Triton's own readiness is no measure of that: in its strict mode (the
    default) one failed model makes it false."""
    outages.begin(0.0)
    await services.redis_health.check()  # 503 when Redis does not answer
    if not await services.backend.live():
        raise BackendUnavailableError("Triton is not reachable", code="not_ready")
    models = await services.catalog.refresh()
    wanted = services.settings.models
    missing = [m for m in wanted if m not in models or not models[m].ready]
    if missing:
        raise BackendUnavailableError(f"Models not ready: {', '.join(missing)}", code="not_ready")
    return {"status": "ready", "models": wanted}
