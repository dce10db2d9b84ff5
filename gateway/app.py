"""The FastAPI application: ``create_app(settings)`` wires the middleware, the routers and
the error handlers, and the lifespan that opens the backend client and Redis and builds the
services over them (:func:`gateway.services.build_services`), and starts this process's
tracer when traces are on (:mod:`gateway.tracing`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI
from redis.asyncio import Redis
from starlette.routing import BaseRoute

from gateway.api.auth import admit, require_admin
from gateway.api.inference import inference_paths
from gateway.api.middleware import Drain, GatewayMiddleware
from gateway.api.routers import (
    admin,
    audio,
    batches,
    chat,
    completions,
    conversations,
    embeddings,
    files,
    health,
    messages,
    models,
    playground,
    realtime,
    realtime_secrets,
    responses,
    sessions,
)
from gateway.api.routers import metrics as metrics_router
from gateway.backend import Backend
from gateway.config import Settings
from gateway.errors import StoreUnavailableError, install_handlers
from gateway.metrics import Metrics
from gateway.outages import Outage
from gateway.services import build_services
from gateway.serving.json_shape import JsonLimits
from gateway.state.migration import LAYOUT, migrate
from gateway.state.redis import REDIS_RESTART_S, connect
from gateway.tracing import Tracing, traces_endpoint

logger = logging.getLogger("gateway")


async def _migrate(redis: Redis) -> asyncio.Task[None] | None:
    """Brings data written by an older gateway to the current key layout before serving;
    with Redis unreachable, keeps trying in the background (nothing is served from Redis
    meanwhile anyway). Returns that task, if any."""

    async def migrated() -> bool:
        try:
            renamed = await migrate(redis)
        except StoreUnavailableError:
            return False
        if renamed:
            logger.warning("moved %d Redis keys to key layout %s", renamed, LAYOUT)
        return True

    async def keep_trying() -> None:
        while True:
            await asyncio.sleep(2)
            if await migrated():
                return

    if await migrated():
        return None
    return asyncio.create_task(keep_trying())


def _triton(settings: Settings, metrics: Metrics) -> Backend:
    """The client of the Triton server, or of the pool of servers, ``triton_url`` names."""
    from gateway.backend import pool
    from gateway.backend.scheduling import Policy
    from gateway.backend.tokenizer import Tokenizers
    from gateway.backend.triton import TritonBackend

    def client(url: str, outage: Outage | None = None) -> Backend:
        return TritonBackend(
            url,
            settings.triton_timeout_s,
            settings.triton_start_timeout_s,
            on_error=metrics.triton_error,
            tokenizers=tokenizers,
            outage=outage,
            on_engine=metrics.engine,
        )

    tokenizers = Tokenizers(settings.tokenizers)

    if pool.is_pool(settings.triton_url):
        # Several servers: a request that finds one down goes to another (no waiting).
        return pool.BackendPool(
            settings.triton_url,
            client,
            settings.triton_check_interval_s,
            policy=Policy.from_settings(settings),
            metrics=metrics,
        )
    # One server: a request waits for it while it comes back.
    outage = Outage(
        "Triton", settings.triton_restart_s, settings.backend_wait_s, metrics.backend_wait
    )
    if not settings.triton_max_inflight:
        return client(settings.triton_url, outage)
    # Requests wait for its slots: the pool holds the queue.
    return pool.BackendPool(
        settings.triton_url,
        lambda url: client(url, outage),
        settings.triton_check_interval_s,
        policy=Policy.from_settings(settings),
        metrics=metrics,
    )


def create_app(settings: Settings | None = None, backend: Backend | None = None) -> FastAPI:
    """Builds the gateway. Without ``backend`` the lifespan connects to Triton at
    ``settings.triton_url``; tests pass a fake one instead. Redis is always the real one at
    ``settings.redis_url``."""
    settings = settings or Settings()
    metrics = Metrics()
    # The models this gateway is configured to serve are label values from the start (the
    # catalog adds what it reads from Triton), so a refusal before the first read that
    # names one is counted under its name, not ``unknown``.
    metrics.models.update(settings.models)
    endpoint = traces_endpoint(settings.otlp_traces_endpoint)
    tracing = Tracing(endpoint) if endpoint else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if tracing is not None:  # here, in the process that serves (after any fork)
            tracing.start()
        active = backend
        if active is None:
            active = _triton(settings, metrics)
        redis = connect(
            settings.redis_url,
            settings.redis_timeout_s,
            settings.redis_max_connections,
            Outage("Redis", REDIS_RESTART_S, settings.backend_wait_s, metrics.backend_wait),
        )
        migration = await _migrate(redis)
        services = build_services(settings, active, redis, metrics)
        app.state.services = services  # read through api.dependencies.ServicesDep
        services.batch_worker.start(app)  # each batch line is a request to this app
        services.redis_health.start()  # gateway_redis_up, traffic or none
        try:
            yield
        finally:
            if migration is not None:
                migration.cancel()
            await services.close()
            await redis.aclose()
            if backend is None:  # we created it, we close it
                await active.close()
            if tracing is not None:
                await tracing.stop()

    logging.getLogger("gateway").setLevel(settings.log_level.upper())
    app = FastAPI(
        title="Triton OpenAI gateway",
        summary="OpenAI-compatible API in front of NVIDIA Triton Inference Server",
        lifespan=lifespan,
        # FastAPI's own telemetry (0.165+; older versions keep unknown keywords as extras)
        # would start as soon as a global tracer provider exists: the gateway's spans are
        # its own (gateway.tracing), so FastAPI's stay off whatever else sets one.
        telemetry={"tracing": False, "metrics": False, "logs": False, "auto_configure": False},
    )
    app.state.metrics = metrics  # the error handlers count 429s here
    app.state.drain = Drain()
    install_handlers(app)
    app.add_middleware(
        GatewayMiddleware,
        metrics=metrics,
        drain=app.state.drain,
        max_body_mb=settings.max_request_mb,
        edge_body_mb=settings.edge_body_mb,
        json_limits=JsonLimits.from_settings(settings),
        tracing=tracing,
        backend_wait_s=settings.backend_wait_s,
        inference_routes=inference_paths(
            route for group in V1_ROUTERS for route in group.router.routes
        ),
        # Upload routes take their file's limit plus 1 MiB of multipart framing (as nginx's
        # cap does), and their 413 names the file.
        uploads={
            "/v1/files": (settings.max_file_mb + 1, "GATEWAY_MAX_FILE_MB"),
            "/v1/audio/transcriptions": (
                settings.max_audio_upload_mb + 1,
                "GATEWAY_MAX_AUDIO_UPLOAD_MB",
            ),
            "/v1/audio/translations": (
                settings.max_audio_upload_mb + 1,
                "GATEWAY_MAX_AUDIO_UPLOAD_MB",
            ),
        },
    )
    app.router.routes.extend(_routes())
    return app


#: The routers of ``/v1`` (their routes carry the full path, ``/v1/...``).
V1_ROUTERS = (
    chat,
    completions,
    responses,
    messages,
    conversations,
    embeddings,
    audio,
    files,
    batches,
    realtime,
    models,
    realtime_secrets,
    sessions,
)


@functools.cache
def _routes() -> list[BaseRoute]:
    """Every route, built once per process: FastAPI analyses each route's parameters and
    dependencies when it is first matched, and keeps that in these objects, which hold
    nothing of one app (a test suite builds hundreds of apps)."""
    routes = APIRouter()
    # Who may call what: each /v1 request is admitted under its key's limits (rpm and
    # concurrency count every request, as OpenAI's do, GETs and the Realtime WebSocket
    # included); the /admin routes take the key check alone and the admin role (their router
    # requires it too); /metrics has its own rule (api/routers/metrics.py); the health
    # probes, the playground and FastAPI's /docs, /redoc and /openapi.json are open.
    v1 = APIRouter(dependencies=[Depends(admit)])
    for group in V1_ROUTERS:
        v1.include_router(group.router)
    routes.include_router(v1)
    routes.include_router(admin.router, dependencies=[Depends(require_admin)])
    routes.include_router(health.router)
    routes.include_router(metrics_router.router)
    routes.include_router(playground.router)
    routes.mount(playground.ASSETS_PATH, playground.assets, name="playground-assets")
    return list(routes.routes)
