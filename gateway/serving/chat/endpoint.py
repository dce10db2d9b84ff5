"""``POST /v1/chat/completions`` whole: which service answers a request (audio in or out,
a stored completion, a plain one), streamed or not. The router hands the request over and
sends back what :meth:`ChatCompletions.create` returns."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gateway.serving.audio_chat import AudioChat
from gateway.serving.catalog import ModelCatalog
from gateway.serving.chat.service import ChatService
from gateway.serving.protocol import ChatCompletionRequest
from gateway.serving.stored_chat import StoredChat
from gateway.state.keys import ApiKey
from gateway.state.limits import Meter

T = TypeVar("T")


class Guard(Protocol):
    """How the API layer awaits work that a client's disconnect cancels."""

    def __call__(self, work: Awaitable[T]) -> Awaitable[T]: ...


@dataclass(frozen=True)
class ChatReply:
    body: str | AsyncIterator[str]
    """A completion's JSON, or a stream's SSE events."""
    headers: dict[str, str]


class ChatCompletions:
    def __init__(
        self, chat: ChatService, audio: AudioChat, stored: StoredChat, catalog: ModelCatalog
    ) -> None:
        self.chat = chat
        self.audio = audio
        self.stored = stored
        self.catalog = catalog

    async def create(
        self,
        body: ChatCompletionRequest,
        key: ApiKey,
        meter: Meter,
        session_id: str | None,
        guard: Guard,
    ) -> ChatReply:
        """The answer to ``body``: its ``input_audio`` parts transcribed first, then spoken
        (``modalities`` with audio), kept (``store``), or neither; streamed or whole."""
        audio = AudioChat.involved(body)
        self.stored.check(body, audio)
        if audio:
            await self.catalog.get(body.model, "chat")  # a 404 before any audio is heard
            body = await guard(self.audio.resolve_inputs(body, key, meter))
        prepared = await self.chat.prepare(body, session_id, owner=key.id)
        headers = {"X-Session-ID": session_id} if session_id else {}
        if audio and body.wants_audio():
            if body.stream:
                return ChatReply(await self.audio.stream(prepared, body, key, meter), headers)
            spoken = await guard(self.audio.complete(prepared, body, key, meter))
            return ChatReply(spoken.model_dump_json(), headers)
        if body.stream:
            if body.store:
                events = await self.stored.stream(prepared, body, key.id, meter)
            else:
                events = await self.chat.stream(prepared, meter)
            return ChatReply(events, headers)
        work = (
            self.stored.complete(prepared, body, key.id, meter)
            if body.store
            else self.chat.complete(prepared, meter)
        )
        completion = await guard(work)
        # Serialized by pydantic-core directly: FastAPI's generic encoder costs more per call.
        return ChatReply(completion.model_dump_json(), headers)
