"""FastAPI dependencies: the services the lifespan created, as ``Annotated`` aliases.

They are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in a worker
thread, and the hand-off to and from that thread cost more CPU than the rest of a request's
dependencies together (seen with py-spy)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from redis.asyncio import Redis

from gateway.backend import Backend
from gateway.config import Settings
from gateway.metrics import Metrics
from gateway.serving.admin import AdminService
from gateway.serving.audio_chat import AudioChat
from gateway.serving.catalog import ModelCatalog
from gateway.serving.chat import ChatService
from gateway.serving.completions import CompletionService
from gateway.serving.embeddings import EmbeddingService
from gateway.serving.responses import ResponsesService
from gateway.serving.speech import SpeechService
from gateway.serving.transcription import TranscriptionService
from gateway.state.sessions import SessionStore


async def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def _backend(request: Request) -> Backend:
    return request.app.state.backend  # type: ignore[no-any-return]


async def _catalog(request: Request) -> ModelCatalog:
    return request.app.state.catalog  # type: ignore[no-any-return]


async def _chat(request: Request) -> ChatService:
    return request.app.state.chat  # type: ignore[no-any-return]


async def _audio_chat(request: Request) -> AudioChat:
    return request.app.state.audio_chat  # type: ignore[no-any-return]


async def _completions(request: Request) -> CompletionService:
    return request.app.state.completions  # type: ignore[no-any-return]


async def _responses(request: Request) -> ResponsesService:
    return request.app.state.responses  # type: ignore[no-any-return]


async def _embeddings(request: Request) -> EmbeddingService:
    return request.app.state.embeddings  # type: ignore[no-any-return]


async def _speech(request: Request) -> SpeechService:
    return request.app.state.speech  # type: ignore[no-any-return]


async def _transcription(request: Request) -> TranscriptionService:
    return request.app.state.transcription  # type: ignore[no-any-return]


async def _redis(request: Request) -> Redis:
    return request.app.state.redis  # type: ignore[no-any-return]


async def _metrics(request: Request) -> Metrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


async def _sessions(request: Request) -> SessionStore:
    return request.app.state.sessions  # type: ignore[no-any-return]


async def _admin(request: Request) -> AdminService:
    return request.app.state.admin  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(_settings)]
BackendDep = Annotated[Backend, Depends(_backend)]
CatalogDep = Annotated[ModelCatalog, Depends(_catalog)]
ChatDep = Annotated[ChatService, Depends(_chat)]
AudioChatDep = Annotated[AudioChat, Depends(_audio_chat)]
CompletionsDep = Annotated[CompletionService, Depends(_completions)]
ResponsesDep = Annotated[ResponsesService, Depends(_responses)]
EmbeddingsDep = Annotated[EmbeddingService, Depends(_embeddings)]
SpeechDep = Annotated[SpeechService, Depends(_speech)]
TranscriptionDep = Annotated[TranscriptionService, Depends(_transcription)]
SessionsDep = Annotated[SessionStore, Depends(_sessions)]
AdminDep = Annotated[AdminService, Depends(_admin)]
RedisDep = Annotated[Redis, Depends(_redis)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
