"""Audio in and out of chat completions, as OpenAI's audio models take and give it.

- In: ``input_audio`` content parts (``{"data": base64, "format": "wav"}``) are transcribed
  by the transcription model (``GATEWAY_MAX_INFLIGHT_PER_REQUEST`` parts at a time) and
  given to the chat model as text. An assistant message that carries only
  ``audio: {"id"}`` (an earlier spoken answer) stands for that answer's transcript, kept
  in Redis for ``GATEWAY_AUDIO_TTL_S`` under the key that asked for it: one key cannot
  read another's.
- The transcription and speech models the gateway picks are checked against the key like
  the chat model it names (a 403 when the key may not use them), both before anything is
  transcribed. A request has at most :data:`MAX_AUDIO_PARTS` parts (in the formats of
  uploads), decoded one after the other in one turn of the replica's
  :class:`~gateway.serving.audio.DecodeSlots` (off the event loop; the turn is held until
  they are transcribed, ``GATEWAY_MAX_DECODES`` requests at a time) and at most
  ``GATEWAY_MAX_AUDIO_SECONDS`` of audio in all (a
  400 ``audio_too_long`` before any part is transcribed): the samples of one request never
  pass that many seconds, whatever the size of its parts.
- Out: ``modalities: ["text", "audio"]`` with ``audio: {"voice", "format"}``. The answer's
  text is spoken by the speech model and returned as ``message.audio`` (``id``, base64
  ``data``, ``expires_at``, ``transcript``; ``content`` is null, as OpenAI sends it).
  Streamed, the chunks carry ``delta.audio``: the transcript as it is generated and the
  audio sentence by sentence (:func:`gateway.serving.voice.spoken`), so the first audio
  comes after the first sentence.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gateway.backend import Backend, TranscriptionOptions
from gateway.errors import InvalidRequestError
from gateway.serving import generation
from gateway.serving.audio import (
    STT_RATE,
    AudioTooLongError,
    DecodeSlot,
    DecodeSlots,
    UndecodableAudioError,
)
from gateway.serving.catalog import DefaultModels
from gateway.serving.chat import ChatService, PreparedChat
from gateway.serving.protocol import (
    AnswerAudio,
    AudioOutput,
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
)
from gateway.serving.speech import PreparedSpeech, SpeechService, resolve_voice
from gateway.serving.sse import ChunkWriter, with_done
from gateway.serving.transcription import transcript
from gateway.serving.voice import TextDelta, Voice, spoken
from gateway.state.keys import ApiKey
from gateway.state.limits import Meter
from gateway.state.transcripts import TranscriptStore

#: ``input_audio`` parts in one request. Each is a transcription job of its own, and
#: Whisper pads every job to a 30 s window: 50 tiny parts cost about what 1500 s
#: (``GATEWAY_MAX_AUDIO_SECONDS``' default) of audio in one part does.
MAX_AUDIO_PARTS = 50

_FORMATS = {"pcm16": "pcm"}  # OpenAI's chat audio format names -> the speech encoder's


def _encoding(output: AudioOutput) -> str:
    return _FORMATS.get(output.format, output.format)


@dataclass(frozen=True)
class _Part:
    """An ``input_audio`` part: where it is (message, content index, param) and its data."""

    message: int
    index: int
    param: str
    data: str


class AudioChat:
    def __init__(
        self,
        backend: Backend,
        chat: ChatService,
        speech: SpeechService,
        models: DefaultModels,
        transcripts: TranscriptStore,
        decoder: DecodeSlots,
        max_audio_seconds: float = 1500.0,
        max_audio_parts: int = MAX_AUDIO_PARTS,
    ) -> None:
        self.backend = backend
        self.decoder = decoder
        self.chat = chat
        self.speech = speech
        self.models = models
        self.transcripts = transcripts
        self.max_audio_seconds = max_audio_seconds
        self.max_audio_parts = max_audio_parts

    @staticmethod
    def involved(request: ChatCompletionRequest) -> bool:
        """Whether the request has audio in or asks for audio out."""
        if request.wants_audio():
            return True
        for message in request.messages:
            if message.audio is not None:
                return True
            content = message.content
            if isinstance(content, list) and any(p.type == "input_audio" for p in content):
                return True
        return False

    async def resolve_inputs(
        self, request: ChatCompletionRequest, key: ApiKey, meter: Meter
    ) -> ChatCompletionRequest:
        """The request with its audio parts replaced by their transcripts, and earlier
        spoken answers by theirs (``key``'s own). Every refusal (a parameter refused, the
        speech model of an audio answer, the transcription model, too many parts, too much
        audio) comes before any part is transcribed."""
        # What chat.prepare would refuse is refused first: such a request must cost no
        # transcription.
        problem = request.unsupported()
        if problem is not None:
            param, why = problem
            raise InvalidRequestError(why, param=param, code="unsupported_parameter")
        if request.wants_audio():
            await self.voice(request, key)
        messages = [m.model_copy(deep=True) for m in request.messages]
        parts = await self._audio_parts(messages, key.id)
        if parts:
            texts = await self._transcripts(parts, key, meter)
            for part, text in zip(parts, texts, strict=True):
                content = messages[part.message].content
                assert isinstance(content, list)
                content[part.index] = ContentPart(type="text", text=text)
        return request.model_copy(update={"messages": messages})

    async def _audio_parts(self, messages: list[ChatMessage], owner: str) -> list[_Part]:
        """The ``input_audio`` parts of ``messages``; replaces each earlier spoken answer
        (``owner``'s) by its transcript on the way."""
        parts: list[_Part] = []
        for i, message in enumerate(messages):
            if message.audio is not None and message.role == "assistant":
                if not message.content:
                    message.content = await self._transcript_of(message.audio.id, owner, i)
                message.audio = None
            if not isinstance(message.content, list):
                continue
            for j, content in enumerate(message.content):
                if content.type != "input_audio":
                    continue
                param = f"messages.[{i}].content.[{j}].input_audio"
                if content.input_audio is None:
                    raise InvalidRequestError(
                        "An input_audio part needs 'input_audio': {data, format}.",
                        param=param,
                    )
                parts.append(_Part(i, j, param, content.input_audio.data))
        return parts

    async def _transcripts(self, parts: list[_Part], key: ApiKey, meter: Meter) -> list[str]:
        """The parts' transcripts, once the key, their number and their length passed."""
        if len(parts) > self.max_audio_parts:
            raise InvalidRequestError(
                f"The messages hold {len(parts)} input_audio parts; at most "
                f"{self.max_audio_parts} are taken in one request.",
                param="messages",
                code="too_many_audio_parts",
            )
        model = (await self.models.info("transcription")).name
        key.require_model(model, parts[0].param, "transcribes input_audio parts here")
        # One turn of the decoder for the request's samples, until they are transcribed.
        turn = await self.decoder.turn()
        try:
            audios = await self._decode_all(turn, parts)
            seconds = sum(audio.size for audio in audios) / STT_RATE
            await meter.check_budget(seconds)  # 429 budget_exceeded when it does not fit
            meter.audio_seconds_in += seconds
            return await self._transcribe_all(model, audios)
        finally:
            turn.release()

    async def _transcript_of(self, audio_id: str, owner: str, index: int) -> str:
        transcript = await self.transcripts.get(owner, audio_id)
        if transcript is None:
            raise InvalidRequestError(
                f"Audio '{audio_id}' is unknown or has expired.",
                param=f"messages.[{index}].audio.id",
                code="audio_not_found",
            )
        return transcript

    async def _decode_all(
        self, turn: DecodeSlot, parts: list[_Part]
    ) -> list[npt.NDArray[np.float32]]:
        """The parts' samples, decoded one after the other, each at most what is left of
        ``max_audio_seconds``: the request's samples never pass it."""
        audios: list[npt.NDArray[np.float32]] = []
        left = self.max_audio_seconds
        for part in parts:
            try:
                data = await asyncio.to_thread(base64.b64decode, part.data, validate=True)
            except ValueError as exc:  # binascii.Error, or a character that is not ASCII
                raise InvalidRequestError(
                    "Invalid input audio: its data is not valid base64.",
                    param=part.param,
                    code="invalid_audio",
                ) from exc
            try:
                audio = await turn.decode(data, left)
            except AudioTooLongError as exc:
                message = (
                    f"the input_audio parts together are longer than "
                    f"{self.max_audio_seconds:g} seconds, the most this gateway takes in "
                    "one request (GATEWAY_MAX_AUDIO_SECONDS)"
                    if audios
                    else str(exc)
                )
                raise InvalidRequestError(
                    f"Invalid input audio: {message}.", param=part.param, code="audio_too_long"
                ) from exc
            except UndecodableAudioError as exc:
                raise InvalidRequestError(
                    f"Invalid input audio: {exc}.",
                    param=part.param,
                    code="invalid_audio",
                    detail=exc.detail,
                ) from exc
            audios.append(audio)
            left -= audio.size / STT_RATE
        return audios

    async def _transcribe_all(self, model: str, audios: list[npt.NDArray[np.float32]]) -> list[str]:
        """The transcripts of ``audios``, ``chat.in_flight`` at a time (the request's share of
        Triton); the first failure cancels the others."""
        gate = asyncio.Semaphore(self.chat.in_flight)

        async def one(audio: npt.NDArray[np.float32]) -> str:
            async with gate:
                return await transcript(self.backend, model, audio, TranscriptionOptions())

        jobs = [asyncio.ensure_future(one(audio)) for audio in audios]
        try:
            return await asyncio.gather(*jobs)
        except BaseException:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise

    async def voice(self, request: ChatCompletionRequest, key: ApiKey) -> tuple[Voice, AudioOutput]:
        """The speech model and voice for the answer; 403 if the key may not use the
        model, 400 for an unknown voice."""
        assert request.audio is not None
        info = await self.models.info("speech")
        key.require_model(info.name, "modalities", "speaks audio answers here")
        try:
            name = resolve_voice(request.audio.voice, info.voices)
        except InvalidRequestError as exc:
            exc.param = "audio.voice"
            raise
        return Voice(info.name, name), request.audio

    async def complete(
        self,
        chat: PreparedChat,
        request: ChatCompletionRequest,
        key: ApiKey,
        meter: Meter,
    ) -> ChatCompletion:
        voice, output = await self.voice(request, key)
        completion = await self.chat.complete(chat, meter)
        message = completion.choices[0].message
        text = message.content
        if not text:
            return completion  # a tool call: nothing to say
        speech = PreparedSpeech(
            model=voice.model,
            text=text,
            voice=voice.voice,
            speed=voice.speed,
            response_format=_encoding(output),
            sse=False,
        )
        body = await self.speech.stream(speech, meter)
        audio = b"".join([piece async for piece in body if isinstance(piece, bytes)])
        audio_id = f"audio_{uuid.uuid4().hex}"
        await self.transcripts.save(key.id, audio_id, text)
        message.audio = AnswerAudio(
            id=audio_id,
            data=base64.b64encode(audio).decode(),
            expires_at=int(time.time()) + self.transcripts.ttl_s,
            transcript=text,
        )
        message.content = None
        return completion

    async def stream(
        self,
        chat: PreparedChat,
        request: ChatCompletionRequest,
        key: ApiKey,
        meter: Meter,
    ) -> AsyncIterator[str]:
        """SSE chunks with ``delta.audio``; raises (for a real status) if generation fails
        before its first token."""
        if chat.tools is not None:
            raise InvalidRequestError(
                "Streamed audio output cannot be combined with tools.", param="tools"
            )
        voice, output = await self.voice(request, key)
        run = await self.chat.reserve_run(chat, meter)
        pieces = await run.stream()
        events = self._events(chat, voice, output, pieces, run, key.id, meter)
        return with_done(events, "chat")

    async def _events(
        self,
        chat: PreparedChat,
        voice: Voice,
        output: AudioOutput,
        pieces: AsyncGenerator[generation.ChoiceChunk, None],
        run: generation.GenerationRun,
        owner: str,
        meter: Meter,
    ) -> AsyncGenerator[str, None]:
        writer = ChunkWriter.chat(chat.id, chat.created, chat.model, chat.include_usage)
        audio_id = f"audio_{uuid.uuid4().hex}"
        expires_at = int(time.time()) + self.transcripts.ttl_s
        said: list[str] = []
        yield writer.delta(0, {"role": "assistant", "content": None})
        texts = generation.texts(pieces, run, chat.reasoning())
        stream = spoken(self.backend, voice, texts, _encoding(output), meter)
        async with aclosing(stream):
            async for item in stream:
                if isinstance(item, TextDelta):
                    said.append(item.text)
                    yield writer.delta(0, {"audio": {"id": audio_id, "transcript": item.text}})
                elif item.data:
                    data = base64.b64encode(item.data).decode()
                    yield writer.delta(0, {"audio": {"id": audio_id, "data": data}})
        text = "".join(said)
        await self.transcripts.save(owner, audio_id, text)
        finish = run.finish_reasons.get(0, "stop")
        yield writer.delta(0, {"audio": {"id": audio_id, "expires_at": expires_at}}, finish)
        message = {"role": "assistant", "content": text}
        await self.chat.remember(chat, message, run.completion_tokens)
        if chat.include_usage:
            yield writer.usage(run.usage())
