"""Every service and store of one gateway process, built once from the settings, the
backend and Redis: :func:`build_services` is the one place where they are wired together,
and :class:`Services` the one typed object the API layer reads them from
(:data:`gateway.api.dependencies.ServicesDep`).

It sits between ``api/`` and ``serving/``: it imports the services and the stores, and only
``app.py`` (which builds it in its lifespan) and ``api/`` import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from redis.asyncio import Redis

from gateway.backend import Backend
from gateway.config import Settings
from gateway.metrics import Metrics
from gateway.serving.admin import AdminService
from gateway.serving.audio import DecodeSlots
from gateway.serving.audio_chat import AudioChat
from gateway.serving.batches import BatchService, BatchWorker
from gateway.serving.catalog import DefaultModels, ModelCatalog
from gateway.serving.chat import ChatService
from gateway.serving.chat.endpoint import ChatCompletions
from gateway.serving.completions import CompletionService
from gateway.serving.conversations import ConversationService
from gateway.serving.embeddings import EmbeddingService
from gateway.serving.files import FileService
from gateway.serving.images import ImageLimits, ImageReader
from gateway.serving.json_shape import JsonLimits
from gateway.serving.messages import MessagesService
from gateway.serving.realtime import RealtimeServices
from gateway.serving.realtime_secrets import RealtimeSecrets
from gateway.serving.request_bounds import RequestBounds
from gateway.serving.responses import ResponsesService
from gateway.serving.responses.background import BackgroundResponses
from gateway.serving.responses.references import References
from gateway.serving.responses.sealing import ReasoningSeal
from gateway.serving.speech import SpeechService
from gateway.serving.stored_chat import StoredChat
from gateway.serving.transcription import TranscriptionService
from gateway.state.admission import Admission, Gatekeeper
from gateway.state.audit import AuditLog
from gateway.state.batches import BatchStore
from gateway.state.budgets import Budgets, Prices
from gateway.state.chat_completions import ChatCompletionStore
from gateway.state.client_secrets import ClientSecretStore
from gateway.state.conversations import ConversationStore
from gateway.state.file_blobs import DirectoryBlobs
from gateway.state.files import FileStore
from gateway.state.headroom import Headroom
from gateway.state.keys import KeyStore
from gateway.state.limits import Limits
from gateway.state.projects import ProjectStore
from gateway.state.redis_health import RedisHealth
from gateway.state.response_events import BackgroundRuns
from gateway.state.responses import ResponseStore
from gateway.state.sessions import SessionStore
from gateway.state.spend import Spend
from gateway.state.stored_bytes import StoredBytes
from gateway.state.transcripts import TranscriptStore


@dataclass(frozen=True, slots=True)
class Services:
    """What the routes, the auth dependencies and the middleware use."""

    settings: Settings
    metrics: Metrics
    backend: Backend
    redis: Redis
    catalog: ModelCatalog
    keys: KeyStore
    gatekeeper: Gatekeeper
    limits: Limits
    budgets: Budgets
    projects: ProjectStore
    spend: Spend
    sessions: SessionStore
    stored_bytes: StoredBytes
    chat: ChatService
    stored_chat: StoredChat
    chat_completions: ChatCompletions
    completions: CompletionService
    responses: ResponsesService
    messages: MessagesService
    background: BackgroundResponses
    conversations: ConversationService
    embeddings: EmbeddingService
    file_store: FileStore
    """Every key's files (``/v1/files``; a batch's input and output files)."""
    files: FileService
    batches: BatchService
    batch_worker: BatchWorker
    """This replica's batch worker (the lifespan starts it with the app it calls)."""
    speech: SpeechService
    transcription: TranscriptionService
    audio_chat: AudioChat
    realtime: RealtimeServices
    realtime_secrets: RealtimeSecrets
    admin: AdminService
    redis_health: RedisHealth
    audit: AuditLog

    async def close(self) -> None:
        """Stops what the services run in the background (not the backend nor Redis: the
        lifespan that opened them closes them)."""
        await self.batch_worker.close()  # its lines' leases given back while Redis is open
        await self.background.close()  # its runs stored failed and settled while Redis is open
        await self.gatekeeper.close()
        await self.redis_health.close()


def build_services(
    settings: Settings, backend: Backend, redis: Redis, metrics: Metrics
) -> Services:
    """The services of one process, over ``backend`` and ``redis``."""
    catalog = ModelCatalog(backend, settings.model_cache_ttl_s, settings.lora_separator, metrics)
    keys = KeyStore(redis)
    limits = Limits(redis)
    budgets = Budgets(redis, Prices(settings.prices), metrics)
    projects = ProjectStore(redis)
    spend = Spend(redis, projects)
    gatekeeper = Gatekeeper(
        redis, limits, settings.concurrency_lease_s, settings.admin_key, budgets=budgets
    )
    stored_bytes = StoredBytes(
        redis, settings.stored_mb_per_key, settings.stored_mb_per_project, Headroom(redis)
    )
    sessions = SessionStore(redis, settings.session_ttl_s, settings.max_stored_kb, stored_bytes)
    chat = ChatService(
        backend,
        catalog,
        settings.default_chat_template,
        sessions,
        metrics,
        default_max_tokens=settings.default_max_tokens,
        in_flight=settings.max_inflight_per_request,
        max_choices=settings.max_choices,
        max_schema_kb=settings.max_schema_kb,
        images=ImageReader(ImageLimits.from_settings(settings)),
        bounds=RequestBounds.from_settings(settings),
        json_limits=JsonLimits.from_settings(settings),
    )
    speech = SpeechService(backend, catalog)
    # One per process: every file decoded here (uploads, input_audio parts) takes its turn.
    decoder = DecodeSlots(
        settings.max_decodes, settings.queue_max_wait_s, settings.queue_max_waiting
    )
    default_models = DefaultModels(catalog, settings)
    # Stored responses and conversations: what item_reference and conversation= read.
    references = References(
        ResponseStore(redis, settings.responses_ttl_s, settings.max_stored_kb, stored_bytes),
        ConversationStore(
            redis,
            settings.responses_ttl_s,
            settings.max_stored_kb,
            settings.max_conversation_items,
            stored_bytes,
        ),
    )
    responses = ResponsesService(
        chat, references.responses, ReasoningSeal.from_settings(settings), references
    )
    realtime = RealtimeServices(
        backend, catalog, chat, default_models, gatekeeper.finish, settings, metrics
    )
    stored_chat = StoredChat(
        chat,
        ChatCompletionStore(
            redis,
            settings.responses_ttl_s,
            settings.max_stored_kb,
            stored_bytes,
            settings.max_stored_chat_completions,
        ),
    )
    file_store = FileStore(
        redis,
        stored_bytes,
        max_file_mb=settings.max_file_mb,
        ttl_s=settings.files_ttl_days * 86_400,
        directory=DirectoryBlobs(settings.files_dir) if settings.files_dir else None,
        metrics=metrics,
    )
    batch_store = BatchStore(redis)
    audit = AuditLog(redis, settings.audit_retention_days, settings.audit_max_entries)
    audio_chat = AudioChat(
        backend,
        chat,
        speech,
        default_models,
        TranscriptStore(redis, settings.audio_ttl_s, stored_bytes),
        decoder,
        settings.max_audio_seconds,
    )
    return Services(
        settings=settings,
        metrics=metrics,
        backend=backend,
        redis=redis,
        catalog=catalog,
        keys=keys,
        gatekeeper=gatekeeper,
        limits=limits,
        budgets=budgets,
        projects=projects,
        spend=spend,
        sessions=sessions,
        stored_bytes=stored_bytes,
        chat=chat,
        stored_chat=stored_chat,
        chat_completions=ChatCompletions(chat, audio_chat, stored_chat, catalog),
        completions=CompletionService(
            backend,
            catalog,
            max_prompts=settings.max_prompts,
            max_choices=settings.max_choices,
            in_flight=settings.max_inflight_per_request,
            max_schema_kb=settings.max_schema_kb,
        ),
        responses=responses,
        messages=MessagesService(chat, backend, ReasoningSeal.from_settings(settings)),
        background=BackgroundResponses(
            responses,
            BackgroundRuns(redis, settings.responses_ttl_s, settings.background_lease_s),
            partial(_settle_background, gatekeeper, metrics),
            settings.max_background_per_key,
            settings.background_lease_s,
        ),
        conversations=ConversationService(references.conversations, references),
        embeddings=EmbeddingService(backend, catalog, settings.max_inflight_per_request),
        file_store=file_store,
        files=FileService(file_store, JsonLimits.from_settings(settings), settings.max_batch_lines),
        batches=BatchService(
            batch_store,
            file_store,
            stored_bytes,
            JsonLimits.from_settings(settings),
            settings.max_batch_lines,
            settings.max_batches_per_key,
        ),
        batch_worker=BatchWorker(
            batch_store,
            file_store,
            stored_bytes,
            metrics,
            settings.batch_concurrency,
            settings.batch_tick_s,
            settings.batch_lease_s,
            max_output_bytes=int(settings.max_file_mb * 1024 * 1024),
        ),
        speech=speech,
        transcription=TranscriptionService(backend, catalog, decoder, settings.max_audio_seconds),
        audio_chat=audio_chat,
        realtime=realtime,
        realtime_secrets=RealtimeSecrets(
            realtime, ClientSecretStore(redis, stored_bytes, settings.max_stored_kb)
        ),
        admin=AdminService(backend, catalog, keys, limits, projects, spend),
        redis_health=RedisHealth(
            redis, lambda up: metrics.redis_up.set(int(up)), settings.redis_check_interval_s
        ),
        audit=audit,
    )


async def _settle_background(
    gatekeeper: Gatekeeper, metrics: Metrics, admission: Admission
) -> None:
    """Settles a background response's run when it ends (its tokens, usage and metrics), as
    the middleware settles a request when it has been answered."""
    await gatekeeper.finish(admission)
    metrics.record_usage(admission.usage())
