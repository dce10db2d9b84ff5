"""FastAPI dependencies: the services the lifespan created, as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.backend import Backend
from gateway.catalog import ModelCatalog
from gateway.chat import ChatService
from gateway.config import Settings
from gateway.speech import SpeechService
from gateway.transcription import TranscriptionService


def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def _backend(request: Request) -> Backend:
    return request.app.state.backend  # type: ignore[no-any-return]


def _catalog(request: Request) -> ModelCatalog:
    return request.app.state.catalog  # type: ignore[no-any-return]


def _chat(request: Request) -> ChatService:
    return request.app.state.chat  # type: ignore[no-any-return]


def _speech(request: Request) -> SpeechService:
    return request.app.state.speech  # type: ignore[no-any-return]


def _transcription(request: Request) -> TranscriptionService:
    return request.app.state.transcription  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(_settings)]
BackendDep = Annotated[Backend, Depends(_backend)]
CatalogDep = Annotated[ModelCatalog, Depends(_catalog)]
ChatDep = Annotated[ChatService, Depends(_chat)]
SpeechDep = Annotated[SpeechService, Depends(_speech)]
TranscriptionDep = Annotated[TranscriptionService, Depends(_transcription)]
