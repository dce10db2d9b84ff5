"""Speech: text in, audio out, streamed sentence by sentence as the model produces it.

Each sentence from Triton is encoded (PyAV, in a worker thread so the event loop never
blocks) and sent at once, as raw audio bytes in the requested format or as SSE events
(``speech.audio.delta`` with base64 audio, then ``speech.audio.done``). The first sentence
is awaited before the response starts, so a request that fails up front gets a real status.

``instructions`` reach a model that takes them (its config maps an input for them); a
model that cannot follow them lists them as ignored, and reads the same words without them.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from gateway.backend import AudioChunk, Backend
from gateway.errors import GatewayError, InvalidRequestError
from gateway.serving.audio import FORMATS, StreamEncoder
from gateway.serving.catalog import ModelCatalog, model_takes
from gateway.serving.protocol import OPENAI_VOICES, SpeechRequest
from gateway.serving.sse import event, first_or_close, with_error_event
from gateway.state.limits import Meter


@dataclass(frozen=True)
class PreparedSpeech:
    model: str
    text: str
    voice: str
    speed: float
    response_format: str
    sse: bool
    instructions: str | None = None
    """How to speak, for a model that takes them (None: none sent)."""

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.sse else FORMATS[self.response_format].content_type


def resolve_voice(requested: str, voices: tuple[str, ...]) -> str:
    """A voice of the model: its own name, or an OpenAI voice name, which maps onto the
    model's default (first) voice. Anything else is a 400."""
    if requested in voices:
        return requested
    if requested in OPENAI_VOICES and voices:
        return voices[0]
    known = ", ".join((*OPENAI_VOICES, *voices))
    raise InvalidRequestError(
        f"Unknown voice '{requested}'. Supported voices: {known}.", param="voice"
    )


class SpeechService:
    def __init__(self, backend: Backend, catalog: ModelCatalog) -> None:
        self.backend = backend
        self.catalog = catalog

    async def prepare(self, request: SpeechRequest) -> PreparedSpeech:
        model = await self.catalog.get(request.model, "speech")
        speed = request.speed
        if speed != 1.0 and not model_takes(model, "speed"):
            speed = 1.0
        instructions = request.instructions or None
        # A model without an input for them ignores them (its profile says so); otherwise
        # a 400, unless the operator accepts them unheeded (openai_ignore).
        if instructions is not None and not model_takes(model, "instructions"):
            instructions = None
        return PreparedSpeech(
            model=request.model,
            text=request.input,
            voice=resolve_voice(request.voice, model.voices),
            speed=speed,
            response_format=request.response_format,
            sse=request.stream_format == "sse",
            instructions=instructions,
        )

    async def stream(
        self, speech: PreparedSpeech, meter: Meter | None = None
    ) -> AsyncIterator[bytes | str]:
        """Starts synthesis and returns the response body; raises if the model fails before
        its first sentence."""
        if meter is not None:  # not sized beforehand: refused once a budget is spent
            await meter.check_budget()
        chunks = self.backend.synthesize(
            speech.model, speech.text, speech.voice, speech.speed, speech.instructions
        )
        first = await first_or_close(chunks)
        if first is None:
            raise GatewayError(f"Model '{speech.model}' produced no audio")
        body = self._encoded(speech, chunks, first, meter or Meter())
        return with_error_event(self._events(body), "speech") if speech.sse else body

    async def _encoded(
        self,
        speech: PreparedSpeech,
        chunks: AsyncGenerator[AudioChunk, None],
        first: AudioChunk,
        meter: Meter,
    ) -> AsyncGenerator[bytes, None]:
        encoder = StreamEncoder(speech.response_format, first.sample_rate)
        async with aclosing(chunks):
            chunk: AudioChunk | None = first
            while chunk is not None:
                meter.audio_seconds_out += chunk.samples.size / chunk.sample_rate
                data = await asyncio.to_thread(encoder.encode, chunk.samples)
                if data:
                    yield data
                chunk = await anext(chunks, None)
            tail = await asyncio.to_thread(encoder.finish)
            if tail:
                yield tail

    async def _events(self, body: AsyncGenerator[bytes, None]) -> AsyncGenerator[str, None]:
        async with aclosing(body):
            async for data in body:
                yield event(
                    {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                )
        yield event({"type": "speech.audio.done"})
