"""The FastAPI application: ``create_app(settings)`` wires routers, error handlers and the
lifespan that owns the backend client."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from redis.asyncio import Redis

from gateway.api.middleware import Drain, GatewayMiddleware
from gateway.api.routers import (
    admin,
    audio,
    chat,
    completions,
    embeddings,
    health,
    models,
    playground,
    realtime,
    responses,
    sessions,
)
from gateway.api.routers import metrics as metrics_router
from gateway.backend import Backend
from gateway.config import Settings
from gateway.errors import StoreUnavailableError, install_handlers
from gateway.metrics import Metrics
from gateway.serving.admin import AdminService
from gateway.serving.audio_chat import AudioChat
from gateway.serving.catalog import DefaultModels, ModelCatalog
from gateway.serving.chat import ChatService
from gateway.serving.completions import CompletionService
from gateway.serving.embeddings import EmbeddingService
from gateway.serving.realtime import RealtimeServices
from gateway.serving.responses import ResponsesService
from gateway.serving.speech import SpeechService
from gateway.serving.transcription import TranscriptionService
from gateway.state.keys import KeyStore
from gateway.state.limits import RateLimiter
from gateway.state.redis import LAYOUT, Headroom, connect, migrate
from gateway.state.responses import ResponseStore
from gateway.state.sessions import SessionStore
from gateway.state.transcripts import TranscriptStore

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
    from gateway.backend.tokenizer import Tokenizers
    from gateway.backend.triton import TritonBackend

    def client(url: str) -> Backend:
        return TritonBackend(
            url,
            settings.triton_timeout_s,
            settings.triton_start_timeout_s,
            on_error=metrics.triton_error,
            tokenizers=tokenizers,
        )

    tokenizers = Tokenizers(settings.tokenizers)

    if not pool.is_pool(settings.triton_url):
        return client(settings.triton_url)
    return pool.BackendPool(settings.triton_url, client, settings.triton_check_interval_s)


def create_app(settings: Settings | None = None, backend: Backend | None = None) -> FastAPI:
    """Builds the gateway. Without ``backend`` the lifespan connects to Triton at
    ``settings.triton_url``; tests pass a fake one instead. Redis is always the real one at
    ``settings.redis_url``."""
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        active = backend
        if active is None:
            active = _triton(settings, metrics)
        redis = connect(settings.redis_url, settings.redis_timeout_s)
        migration = await _migrate(redis)
        catalog = ModelCatalog(active, settings.model_cache_ttl_s)
        app.state.backend = active
        app.state.redis = redis
        app.state.catalog = catalog
        app.state.keys = KeyStore(redis, settings.admin_key)
        app.state.limiter = RateLimiter(redis, settings.concurrency_lease_s)
        headroom = Headroom(redis)
        app.state.sessions = SessionStore(
            redis, settings.session_ttl_s, settings.max_stored_kb, headroom
        )
        app.state.chat = ChatService(
            active,
            catalog,
            settings.default_chat_template,
            app.state.sessions,
            metrics,
            default_max_tokens=settings.default_max_tokens,
            in_flight=settings.max_inflight_per_request,
            max_choices=settings.max_choices,
            max_schema_kb=settings.max_schema_kb,
        )
        app.state.completions = CompletionService(
            active,
            catalog,
            max_prompts=settings.max_prompts,
            max_choices=settings.max_choices,
            in_flight=settings.max_inflight_per_request,
            max_schema_kb=settings.max_schema_kb,
        )
        app.state.responses = ResponsesService(
            app.state.chat,
            ResponseStore(redis, settings.responses_ttl_s, settings.max_stored_kb, headroom),
        )
        app.state.embeddings = EmbeddingService(active, catalog, settings.max_inflight_per_request)
        app.state.speech = SpeechService(active, catalog)
        app.state.transcription = TranscriptionService(active, catalog, settings.max_audio_seconds)
        app.state.voice_models = DefaultModels(catalog, settings)
        app.state.audio_chat = AudioChat(
            active,
            app.state.chat,
            app.state.speech,
            app.state.voice_models,
            TranscriptStore(redis, settings.audio_ttl_s),
            settings.max_audio_seconds,
        )
        app.state.realtime = RealtimeServices(
            active,
            catalog,
            app.state.chat,
            app.state.voice_models,
            app.state.limiter,
            app.state.keys,
            settings,
            metrics,
        )
        app.state.admin = AdminService(active, catalog, app.state.keys, app.state.limiter)
        try:
            yield
        finally:
            if migration is not None:
                migration.cancel()
            await app.state.limiter.close()
            await redis.aclose()
            if backend is None:  # we created it, we close it
                await active.close()

    logging.getLogger("gateway").setLevel(settings.log_level.upper())
    app = FastAPI(
        title="Triton OpenAI gateway",
        summary="OpenAI-compatible API in front of NVIDIA Triton Inference Server",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.drain = Drain()
    install_handlers(app)
    app.add_middleware(
        GatewayMiddleware,
        metrics=metrics,
        drain=app.state.drain,
        max_body_mb=settings.max_request_mb,
    )
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(responses.router)
    app.include_router(embeddings.router)
    app.include_router(audio.router)
    app.include_router(realtime.router)
    app.include_router(models.router)
    app.include_router(sessions.router)
    app.include_router(admin.router)
    app.include_router(health.router)
    app.include_router(metrics_router.router)
    app.include_router(playground.router)
    app.mount(playground.ASSETS_PATH, playground.assets, name="playground-assets")
    return app
