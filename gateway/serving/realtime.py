"""The OpenAI Realtime API (GA event names) over one WebSocket: a voice conversation.

A :class:`RealtimeSession` owns one connection's conversation. The router feeds it the
client's events (:meth:`RealtimeSession.handle`) and it sends server events through the
``send`` callback it was given. What happens to a spoken turn:

1. ``input_audio_buffer.append``: 24 kHz pcm16 is resampled to 16 kHz (PyAV) and kept; with
   ``server_vad`` it also goes through Silero VAD (:mod:`gateway.serving.vad`), which
   reports ``speech_started`` / ``speech_stopped``. Speech that starts while a response
   plays cancels it (barge-in, ``interrupt_response``).
2. The turn is committed (silence after speech, or ``input_audio_buffer.commit``): a user
   item is added and its audio transcribed by the transcription model. While the VAD waits
   for the silence to last ``silence_duration_ms``, the audio so far is already being
   transcribed; if the user goes on speaking that guess is dropped, else it is the
   transcript, so the wait hides the transcription.
3. A response (automatic after a VAD turn, or ``response.create``): the conversation is
   rendered with the chat model's template and generated; its text streams as transcript
   (or text) deltas and is spoken sentence by sentence (:mod:`gateway.serving.voice`).
   ``response.cancel``, barge-in or a closed connection stop the Triton requests.

Work runs in order on one worker task (a transcription, then the response that needs it),
so the receive loop never waits for a model and audio keeps flowing into the VAD.
Every response is admitted under the key's rate limits like a request and its tokens and
audio seconds are recorded as usage when it ends.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import av
import numpy as np
import numpy.typing as npt

from gateway.backend import Backend, TranscriptionOptions
from gateway.config import Settings
from gateway.errors import GatewayError, InvalidRequestError
from gateway.metrics import Metrics
from gateway.serving import generation
from gateway.serving.audio import PCM_RATE, STT_RATE
from gateway.serving.catalog import ModelCatalog
from gateway.serving.chat import ChatService
from gateway.serving.protocol import ChatCompletionRequest
from gateway.serving.speech import resolve_voice
from gateway.serving.vad import SpeechStarted, SpeechStopped, TurnDetector, VadSettings
from gateway.serving.voice import TextDelta, Voice, VoiceModels, spoken
from gateway.state.keys import KeyStore
from gateway.state.limits import Admission, Meter, RateLimiter

logger = logging.getLogger("gateway.realtime")

Send = Callable[[dict[str, Any]], Awaitable[None]]

#: OpenAI refuses to commit less than 100 ms of audio.
MIN_COMMIT_MS = 100
PCM_FORMAT = {"type": "audio/pcm", "rate": PCM_RATE}
_BYTES_PER_MS = PCM_RATE * 2 // 1000


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class ClientEventError(InvalidRequestError):
    """A client event the session cannot act on: sent back as an ``error`` event."""


@dataclass
class SessionConfig:
    """The session's settings, as ``session.update`` changes them."""

    model: str
    voice: str
    transcription_model: str
    instructions: str = ""
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    vad: VadSettings | None = field(default_factory=VadSettings)
    create_response: bool = True
    interrupt_response: bool = True
    transcribe_events: bool = True
    """Send ``conversation.item.input_audio_transcription.*`` (``transcription`` set)."""
    language: str | None = None
    prompt: str | None = None
    speed: float = 1.0
    max_output_tokens: int | None = None
    temperature: float | None = None

    def to_json(self, session_id: str) -> dict[str, Any]:
        detection: dict[str, Any] | None = None
        if self.vad is not None:
            detection = {
                "type": "server_vad",
                "threshold": self.vad.threshold,
                "prefix_padding_ms": self.vad.prefix_padding_ms,
                "silence_duration_ms": self.vad.silence_duration_ms,
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
                "idle_timeout_ms": None,
            }
        transcription = None
        if self.transcribe_events:
            transcription = {
                "model": self.transcription_model,
                "language": self.language,
                "prompt": self.prompt,
            }
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": self.output_modalities,
            "instructions": self.instructions,
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": self.max_output_tokens or "inf",
            "audio": {
                "input": {
                    "format": PCM_FORMAT,
                    "transcription": transcription,
                    "noise_reduction": None,
                    "turn_detection": detection,
                },
                "output": {"format": PCM_FORMAT, "voice": self.voice, "speed": self.speed},
            },
        }


@dataclass
class Item:
    """A conversation item: a message with its parts (the audio itself is not kept)."""

    id: str
    role: str
    content: list[dict[str, Any]]
    status: str = "completed"
    spoken: list[tuple[int, str]] = field(default_factory=list)
    """Assistant audio: where each spoken sentence starts (ms) and its text (truncation)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "object": "realtime.item",
            "role": self.role,
            "status": self.status,
            "content": self.content,
        }

    def text(self) -> str:
        """What the chat model sees of it."""
        parts = []
        for part in self.content:
            text = part.get("text") if part["type"] in ("input_text", "output_text") else None
            if text is None:
                text = part.get("transcript")
            if text:
                parts.append(text)
        return " ".join(parts)


class InputAudio:
    """The input audio buffer: 24 kHz pcm16 in, 16 kHz float kept (what VAD and the
    transcription model take), with where it starts in the session's audio."""

    def __init__(self) -> None:
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=STT_RATE)
        self._pts = 0
        self.parts: list[npt.NDArray[np.float32]] = []
        self.size = 0
        self.start_ms = 0  # where the buffer starts, in the session's audio
        self.total_ms = 0.0  # all audio appended in the session

    def append(self, pcm: bytes) -> npt.NDArray[np.float32]:
        samples = np.frombuffer(pcm, dtype="<i2")
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = PCM_RATE
        frame.pts = self._pts
        self._pts += samples.size
        self.total_ms += samples.size * 1000 / PCM_RATE
        out = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        audio = np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
        self.parts.append(audio)
        self.size += audio.size
        return audio

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.size * 1000 // STT_RATE

    def audio(self, from_ms: int | None = None) -> npt.NDArray[np.float32]:
        whole = np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=np.float32)
        skip = max(0, (from_ms or self.start_ms) - self.start_ms) * STT_RATE // 1000
        return whole[skip:]

    def take(self, from_ms: int | None = None) -> npt.NDArray[np.float32]:
        """The buffered audio (from ``from_ms``), and the buffer emptied."""
        audio = self.audio(from_ms)
        self.clear()
        return audio

    def clear(self) -> None:
        self.start_ms = self.end_ms
        self.parts = []
        self.size = 0


@dataclass
class Response:
    id: str
    modalities: list[str]
    instructions: str
    max_output_tokens: int | None
    reason: str = "client_cancelled"
    """Why it was cancelled, if it is (``turn_detected`` for barge-in)."""
    task: asyncio.Task[None] | None = None
    turn_ended: float | None = None
    """When the user's turn ended (monotonic), for the first-audio latency metric."""


@dataclass
class _Guess:
    """A transcription started when the user fell silent, before the turn was committed."""

    from_ms: int
    voiced_windows: int  # the detector's mark when it was made
    task: asyncio.Task[str]


class RealtimeServices:
    """What every session shares."""

    def __init__(
        self,
        backend: Backend,
        catalog: ModelCatalog,
        chat: ChatService,
        models: VoiceModels,
        limiter: RateLimiter,
        keys: KeyStore,
        settings: Settings,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.catalog = catalog
        self.chat = chat
        self.models = models
        self.limiter = limiter
        self.keys = keys
        self.metrics = metrics

    async def chat_model(self, requested: str | None) -> str:
        """The chat model a session asked for: one of ours by name, or the default for an
        OpenAI realtime model name (``gpt-realtime``...) or none; 404 for anything else."""
        if requested:
            found = await self.catalog.find(requested)
            if found is not None and found.task == "chat":
                return requested
            if not requested.startswith("gpt-"):
                await self.catalog.get(requested, "chat")  # raises the right 404 or 400
        return await self.models.pick("chat")

    async def open(
        self, requested_model: str | None, presented_key: str, send: Send
    ) -> RealtimeSession:
        model = await self.chat_model(requested_model)
        info = await self.models.info("speech")
        speech = info.name
        config = SessionConfig(
            model=model,
            voice=info.voices[0] if info.voices else "alloy",
            transcription_model=await self.models.pick("transcription"),
            instructions=self.settings.realtime_instructions,
            temperature=self.settings.realtime_temperature,
        )
        return RealtimeSession(self, config, speech, presented_key, send)


class RealtimeSession:
    def __init__(
        self,
        services: RealtimeServices,
        config: SessionConfig,
        speech_model: str,
        presented_key: str,
        send: Send,
    ) -> None:
        self.services = services
        self.config = config
        self.speech_model = speech_model
        self.presented_key = presented_key
        self._send = send
        self.id = _id("sess")
        self.items: list[Item] = []
        self.buffer = InputAudio()
        self.detector: TurnDetector | None = (
            TurnDetector(config.vad) if config.vad is not None else None
        )
        self.meter = Meter()
        """What the connection used outside responses (transcriptions no response
        followed); recorded when it closes."""
        self._pending_audio_in = 0.0
        self._speech_item: str | None = None  # the item id of the speech in progress
        self._speech_start_ms = 0
        self._guess: _Guess | None = None
        self._jobs: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self.response: Response | None = None
        self.closed = False

    # --- sending ------------------------------------------------------------------------

    async def emit(self, kind: str, **fields: Any) -> None:
        if self.closed:
            return
        await self._send({"type": kind, "event_id": _id("event"), **fields})

    async def error(self, exc: GatewayError, client_event: str | None = None) -> None:
        body = exc.body()["error"]
        await self.emit("error", error={**body, "event_id": client_event})

    # --- life ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._worker = asyncio.create_task(self._work())
        await self.emit("session.created", session=self.config.to_json(self.id))

    async def close(self) -> None:
        """The connection is gone: stops the work in progress (and its Triton requests)
        and records what the session used outside responses."""
        self.closed = True
        if self.response is not None and self.response.task is not None:
            self.response.task.cancel()
        if self._guess is not None:
            self._guess.task.cancel()
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self.meter.audio_seconds_in += self._pending_audio_in

    async def _work(self) -> None:
        while True:
            job = await self._jobs.get()
            try:
                await job()
            except asyncio.CancelledError:
                if self.closed:
                    raise
            except GatewayError as exc:
                await self.error(exc)
            except Exception:
                logger.exception("realtime job failed")
                await self.error(GatewayError("The server had an error in this session."))

    # --- client events ------------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> None:
        """Acts on one client event; a bad one gets an ``error`` event, nothing more."""
        event_id = None
        try:
            try:
                event = json.loads(raw)
            except ValueError as exc:
                raise ClientEventError(
                    f"The event is not valid JSON: {exc}.", code="invalid_json"
                ) from exc
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ClientEventError(
                    "An event must be a JSON object with a 'type'.", param="type"
                )
            event_id = event.get("event_id")
            handler = self._handlers.get(event["type"])
            if handler is None:
                raise ClientEventError(
                    f"Unknown event type '{event['type']}'.", param="type", code="invalid_event"
                )
            await handler(self, event)
        except GatewayError as exc:
            await self.error(exc, event_id if isinstance(event_id, str) else None)

    async def _session_update(self, event: dict[str, Any]) -> None:
        session = _object(event.get("session"), "session")
        config = self.config
        kind = session.get("type", "realtime")
        if kind != "realtime":
            raise ClientEventError(
                f"Session type '{kind}' is not supported; use 'realtime'.", param="session.type"
            )
        if session.get("model"):
            config.model = await self.services.chat_model(str(session["model"]))
        if "instructions" in session:
            config.instructions = str(session["instructions"] or "")
        if "output_modalities" in session:
            config.output_modalities = _modalities(
                session["output_modalities"], "session.output_modalities"
            )
        if "max_output_tokens" in session:
            config.max_output_tokens = _max_tokens(
                session["max_output_tokens"], "session.max_output_tokens"
            )
        if session.get("tools"):
            raise ClientEventError(
                "Tools are not supported in Realtime sessions by this gateway.",
                param="session.tools",
                code="unsupported_parameter",
            )
        audio = _object(session.get("audio") or {}, "session.audio")
        self._update_input(_object(audio.get("input") or {}, "session.audio.input"))
        output = _object(audio.get("output") or {}, "session.audio.output")
        _check_format(output.get("format"), "session.audio.output.format")
        if "voice" in output:
            info = await self.services.catalog.get(self.speech_model, "speech")
            voice = output["voice"]
            name = voice.get("id") if isinstance(voice, dict) else voice
            config.voice = resolve_voice(str(name), info.voices)
        if "speed" in output:
            speed = output["speed"]
            if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
                raise ClientEventError(
                    "speed must be a number from 0.25 to 4.0.",
                    param="session.audio.output.speed",
                )
            config.speed = float(speed)
        await self.emit("session.updated", session=config.to_json(self.id))

    def _update_input(self, audio_in: dict[str, Any]) -> None:
        config = self.config
        _check_format(audio_in.get("format"), "session.audio.input.format")
        if "transcription" in audio_in:
            transcription = audio_in["transcription"]
            config.transcribe_events = transcription is not None
            if transcription:
                spec = _object(transcription, "session.audio.input.transcription")
                config.language = spec.get("language") or None
                config.prompt = spec.get("prompt") or None
        if "turn_detection" not in audio_in:
            return
        detection = audio_in["turn_detection"]
        if detection is None:
            config.vad = None
            self.detector = None
            return
        spec = _object(detection, "session.audio.input.turn_detection")
        if spec.get("type", "server_vad") != "server_vad":
            raise ClientEventError(
                f"Turn detection '{spec.get('type')}' is not supported; use 'server_vad' or null.",
                param="session.audio.input.turn_detection.type",
                code="unsupported_parameter",
            )
        base = config.vad or VadSettings()
        threshold = spec.get("threshold", base.threshold)
        padding = spec.get("prefix_padding_ms", base.prefix_padding_ms)
        silence = spec.get("silence_duration_ms", base.silence_duration_ms)
        if not isinstance(threshold, int | float) or not 0.0 <= threshold <= 1.0:
            raise ClientEventError(
                "threshold must be from 0.0 to 1.0.",
                param="session.audio.input.turn_detection.threshold",
            )
        for name, value in (("prefix_padding_ms", padding), ("silence_duration_ms", silence)):
            if not isinstance(value, int) or not 0 <= value <= 10_000:
                raise ClientEventError(
                    f"{name} must be an integer from 0 to 10000.",
                    param=f"session.audio.input.turn_detection.{name}",
                )
        config.create_response = bool(spec.get("create_response", config.create_response))
        config.interrupt_response = bool(spec.get("interrupt_response", config.interrupt_response))
        settings = VadSettings(float(threshold), padding, silence)
        if settings != config.vad or self.detector is None:
            config.vad = settings
            self.detector = TurnDetector(settings)

    async def _append(self, event: dict[str, Any]) -> None:
        data = event.get("audio")
        if not isinstance(data, str):
            raise ClientEventError("audio must be base64-encoded pcm16.", param="audio")
        pcm = _b64(data, "audio")
        if not pcm:
            return
        audio = self.buffer.append(pcm)
        if self.detector is None:
            return
        for found in self.detector.feed(audio):
            if isinstance(found, SpeechStarted):
                await self._speech_started(found.at_ms)
            elif isinstance(found, SpeechStopped):
                await self._speech_stopped(found.at_ms)
        if self.detector.speaking and self._guess is None:
            self._maybe_guess()

    def _maybe_guess(self) -> None:
        """When the user has gone quiet, transcribe the turn so far while the VAD waits."""
        detector = self.detector
        if detector is None or not detector.silent_ms or self._speech_item is None:
            return
        if detector.silent_ms < min(200, detector.settings.silence_duration_ms // 2):
            return
        from_ms = max(self._speech_start_ms, self.buffer.start_ms)
        audio = self.buffer.audio(from_ms)
        task = asyncio.create_task(self._transcribe(audio))
        self._guess = _Guess(from_ms, detector.voiced_windows, task)

    def _drop_guess(self) -> None:
        if self._guess is not None:
            self._guess.task.cancel()
            self._guess = None

    async def _speech_started(self, at_ms: int) -> None:
        self._drop_guess()
        self._speech_item = _id("item")
        self._speech_start_ms = at_ms
        await self.emit(
            "input_audio_buffer.speech_started", audio_start_ms=at_ms, item_id=self._speech_item
        )
        if self.config.interrupt_response and self.response is not None:
            self._cancel(self.response, "turn_detected")

    async def _speech_stopped(self, at_ms: int) -> None:
        item_id = self._speech_item or _id("item")
        await self.emit("input_audio_buffer.speech_stopped", audio_end_ms=at_ms, item_id=item_id)
        guess = self._guess
        self._guess = None
        from_ms = max(self._speech_start_ms, self.buffer.start_ms)
        voiced = self.detector.voiced_windows if self.detector is not None else -1
        if guess is not None and (guess.from_ms != from_ms or guess.voiced_windows != voiced):
            guess.task.cancel()
            guess = None
        audio = self.buffer.take(from_ms)
        self._speech_item = None
        await self._commit(item_id, audio, guess.task if guess else None)
        if self.config.create_response:
            self._queue_response(self._new_response({}), time.monotonic())

    async def _commit_event(self, event: dict[str, Any]) -> None:
        if self.buffer.end_ms - self.buffer.start_ms < MIN_COMMIT_MS:
            raise ClientEventError(
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has "
                f"{self.buffer.end_ms - self.buffer.start_ms}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        self._drop_guess()
        item_id = self._speech_item or _id("item")
        self._speech_item = None
        if self.detector is not None:
            self.detector.reset()
        await self._commit(item_id, self.buffer.take(), None)

    async def _clear(self, event: dict[str, Any]) -> None:
        self._drop_guess()
        self.buffer.clear()
        self._speech_item = None
        if self.detector is not None:
            self.detector.reset()
        await self.emit("input_audio_buffer.cleared")

    async def _commit(
        self, item_id: str, audio: npt.NDArray[np.float32], guess: asyncio.Task[str] | None
    ) -> None:
        previous = self.items[-1].id if self.items else None
        item = Item(item_id, "user", [{"type": "input_audio", "transcript": None}], "completed")
        self.items.append(item)
        await self.emit("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)
        await self.emit("conversation.item.added", item=item.to_json(), previous_item_id=previous)
        self._jobs.put_nowait(lambda: self._transcribe_item(item, audio, guess))

    async def _transcribe(self, audio: npt.NDArray[np.float32]) -> str:
        options = TranscriptionOptions(language=self.config.language, prompt=self.config.prompt)
        segments = self.services.backend.transcribe(self.config.transcription_model, audio, options)
        async with aclosing(segments):
            texts = [segment.text async for segment in segments]
        return "".join(texts).strip()

    async def _transcribe_item(
        self, item: Item, audio: npt.NDArray[np.float32], guess: asyncio.Task[str] | None
    ) -> None:
        seconds = audio.size / STT_RATE
        transcript = await guess if guess is not None else await self._transcribe(audio)
        self._pending_audio_in += seconds
        item.content[0]["transcript"] = transcript
        if self.config.transcribe_events:
            await self.emit(
                "conversation.item.input_audio_transcription.completed",
                item_id=item.id,
                content_index=0,
                transcript=transcript,
                usage={"type": "duration", "seconds": round(seconds, 3)},
            )
        await self.emit("conversation.item.done", item=item.to_json())

    async def _item_create(self, event: dict[str, Any]) -> None:
        spec = _object(event.get("item"), "item")
        if spec.get("type", "message") != "message":
            raise ClientEventError(
                f"Items of type '{spec.get('type')}' are not supported; send messages.",
                param="item.type",
                code="unsupported_parameter",
            )
        role = spec.get("role")
        if role not in ("user", "assistant", "system"):
            raise ClientEventError(
                "role must be 'user', 'assistant' or 'system'.", param="item.role"
            )
        content = spec.get("content")
        if not isinstance(content, list) or not content:
            raise ClientEventError("content must be a non-empty list.", param="item.content")
        parts: list[dict[str, Any]] = []
        audio: npt.NDArray[np.float32] | None = None
        allowed = {"user": ("input_text", "input_audio"), "system": ("input_text",)}.get(
            role, ("output_text", "output_audio")
        )
        for index, part in enumerate(content):
            part = _object(part, f"item.content[{index}]")
            kind = part.get("type")
            if kind not in allowed:
                raise ClientEventError(
                    f"A {role} message takes parts of type {' or '.join(allowed)}.",
                    param=f"item.content[{index}].type",
                )
            if kind == "input_audio" and part.get("audio"):
                if audio is not None:
                    raise ClientEventError(
                        "A message takes one input_audio part.", param="item.content"
                    )
                audio = _pcm_to_stt(_b64(part["audio"], f"item.content[{index}].audio"))
                parts.append({"type": "input_audio", "transcript": None})
            elif kind in ("input_text", "output_text"):
                parts.append({"type": kind, "text": str(part.get("text") or "")})
            else:
                parts.append({"type": kind, "transcript": str(part.get("transcript") or "")})
        item_id = spec.get("id") or _id("item")
        if any(existing.id == item_id for existing in self.items):
            raise ClientEventError(f"Item '{item_id}' already exists.", param="item.id")
        item = Item(str(item_id), role, parts)
        previous = event.get("previous_item_id")
        position = len(self.items)
        if previous == "root":
            position = 0
        elif previous:
            position = self._index(previous, "previous_item_id") + 1
        prior = self.items[position - 1].id if position else None
        self.items.insert(position, item)
        await self.emit("conversation.item.added", item=item.to_json(), previous_item_id=prior)
        if audio is None:
            await self.emit("conversation.item.done", item=item.to_json())
            return
        self._jobs.put_nowait(lambda: self._transcribe_item(item, audio, None))

    def _index(self, item_id: object, param: str) -> int:
        for index, item in enumerate(self.items):
            if item.id == item_id:
                return index
        raise ClientEventError(
            f"Item with item_id '{item_id}' not found.", param=param, code="item_not_found"
        )

    async def _item_delete(self, event: dict[str, Any]) -> None:
        index = self._index(event.get("item_id"), "item_id")
        item = self.items.pop(index)
        await self.emit("conversation.item.deleted", item_id=item.id)

    async def _item_retrieve(self, event: dict[str, Any]) -> None:
        item = self.items[self._index(event.get("item_id"), "item_id")]
        await self.emit("conversation.item.retrieved", item=item.to_json())

    async def _item_truncate(self, event: dict[str, Any]) -> None:
        item = self.items[self._index(event.get("item_id"), "item_id")]
        end_ms = event.get("audio_end_ms")
        if item.role != "assistant" or not item.spoken:
            raise ClientEventError(
                "Only an assistant message with audio can be truncated.", param="item_id"
            )
        if not isinstance(end_ms, int) or end_ms < 0:
            raise ClientEventError(
                "audio_end_ms must be a non-negative integer.", param="audio_end_ms"
            )
        heard = [sentence for start, sentence in item.spoken if start < end_ms]
        item.spoken = item.spoken[: len(heard)]
        item.content = [{"type": "output_audio", "transcript": " ".join(heard)}]
        await self.emit(
            "conversation.item.truncated",
            item_id=item.id,
            content_index=event.get("content_index", 0),
            audio_end_ms=end_ms,
        )

    # --- responses ----------------------------------------------------------------------

    def _new_response(self, spec: dict[str, Any]) -> Response:
        modalities = _modalities(
            spec.get("output_modalities") or self.config.output_modalities,
            "response.output_modalities",
        )
        max_tokens = self.config.max_output_tokens
        if "max_output_tokens" in spec:
            max_tokens = _max_tokens(spec["max_output_tokens"], "response.max_output_tokens")
        instructions = spec.get("instructions")
        return Response(
            id=_id("resp"),
            modalities=modalities,
            instructions=self.config.instructions if instructions is None else str(instructions),
            max_output_tokens=max_tokens,
        )

    async def _response_create(self, event: dict[str, Any]) -> None:
        if self.response is not None:
            raise ClientEventError(
                f"Conversation already has an active response in progress: "
                f"{self.response.id}. Wait until the response is finished before creating "
                "a new one.",
                code="conversation_already_has_active_response",
            )
        spec = _object(event.get("response") or {}, "response")
        self._queue_response(self._new_response(spec), None)

    def _queue_response(self, response: Response, turn_ended: float | None) -> None:
        if self.response is not None:
            return  # one at a time; a VAD turn during a response that went on is heard next
        response.turn_ended = turn_ended
        self.response = response
        self._jobs.put_nowait(lambda: self._run_response(response))

    async def _response_cancel(self, event: dict[str, Any]) -> None:
        response = self.response
        if response is None:
            raise ClientEventError(
                "Cancellation failed: no active response found.",
                code="response_cancel_not_active",
            )
        self._cancel(response, "client_cancelled")

    def _cancel(self, response: Response, reason: str) -> None:
        response.reason = reason
        if response.task is not None:
            response.task.cancel()
        else:
            self.response = None  # queued, not started: it never begins

    async def _run_response(self, response: Response) -> None:
        if self.response is not response:
            return
        response.task = asyncio.current_task()
        try:
            await _Responder(self, response).run()
        finally:
            if self.response is response:
                self.response = None

    _handlers: ClassVar[dict[str, Callable[[RealtimeSession, dict[str, Any]], Awaitable[None]]]] = {
        "session.update": _session_update,
        "input_audio_buffer.append": _append,
        "input_audio_buffer.commit": _commit_event,
        "input_audio_buffer.clear": _clear,
        "conversation.item.create": _item_create,
        "conversation.item.delete": _item_delete,
        "conversation.item.retrieve": _item_retrieve,
        "conversation.item.truncate": _item_truncate,
        "response.create": _response_create,
        "response.cancel": _response_cancel,
    }


class _Responder:
    """One response: admitted, generated, spoken, and its events."""

    def __init__(self, session: RealtimeSession, response: Response) -> None:
        self.session = session
        self.response = response
        self.audio = response.modalities == ["audio"]
        self.item = Item(_id("item"), "assistant", [], "in_progress")
        self.text: list[str] = []
        self.audio_ms = 0.0
        self.status = "completed"
        self.details: dict[str, Any] | None = None
        self.tally: generation.Tally | None = None
        self.started = False

    def _json(self, status: str) -> dict[str, Any]:
        session = self.session
        usage = None
        if self.tally is not None and status != "in_progress":
            prompt, completion = self.tally.prompt_tokens, self.tally.completion_tokens
            usage = {
                "total_tokens": prompt + completion,
                "input_tokens": prompt,
                "output_tokens": completion,
                "input_token_details": {
                    "text_tokens": prompt,
                    "audio_tokens": 0,
                    "cached_tokens": 0,
                },
                "output_token_details": {"text_tokens": completion, "audio_tokens": 0},
            }
        return {
            "id": self.response.id,
            "object": "realtime.response",
            "status": status,
            "status_details": self.details,
            "output": [self.item.to_json()] if self.started else [],
            "output_modalities": self.response.modalities,
            "conversation_id": session.id,
            "max_output_tokens": self.response.max_output_tokens or "inf",
            "audio": {"output": {"format": PCM_FORMAT, "voice": session.config.voice}},
            "usage": usage,
            "metadata": None,
        }

    def _where(self) -> dict[str, Any]:
        return {
            "response_id": self.response.id,
            "item_id": self.item.id,
            "output_index": 0,
            "content_index": 0,
        }

    async def run(self) -> None:
        session = self.session
        services = session.services
        admission = await services.limiter.admit(
            services.keys, session.presented_key, hold_lease=False
        )
        admission.model = session.config.model
        admission.meter.audio_seconds_in += session._pending_audio_in
        session._pending_audio_in = 0.0
        try:
            await session.emit("response.created", response=self._json("in_progress"))
            await self._generate(admission)
        except asyncio.CancelledError:
            if session.closed:
                raise
            self.status = "cancelled"
            self.details = {"type": "cancelled", "reason": self.response.reason}
        except GatewayError as exc:
            self.status = "failed"
            self.details = {"type": "failed", "error": exc.body()["error"]}
            await session.error(exc)
        finally:
            await asyncio.shield(self._finish(admission))

    async def _generate(self, admission: Admission) -> None:
        session = self.session
        config = session.config
        messages: list[dict[str, Any]] = []
        if self.response.instructions:
            messages.append({"role": "system", "content": self.response.instructions})
        for item in session.items:
            text = item.text()
            if text:
                messages.append({"role": item.role, "content": text})
        if not any(m["role"] == "user" for m in messages):
            raise ClientEventError(
                "The conversation has no user message to respond to.",
                code="conversation_empty",
            )
        request = ChatCompletionRequest.model_validate(
            {
                "model": config.model,
                "messages": messages,
                "max_tokens": self.response.max_output_tokens,
                "temperature": config.temperature,
            }
        )
        chat = await session.services.chat.prepare(request)
        self.tally = await chat.tally(admission.meter)
        pieces = await generation.stream(session.services.backend, chat.model, self.tally)
        self.started = True
        previous = session.items[-1].id if session.items else None
        session.items.append(self.item)
        part = {"type": "audio", "transcript": ""} if self.audio else {"type": "text", "text": ""}
        self.item.content = [
            {"type": "output_audio", "transcript": ""}
            if self.audio
            else {"type": "output_text", "text": ""}
        ]
        await session.emit(
            "response.output_item.added",
            response_id=self.response.id,
            output_index=0,
            item=self.item.to_json(),
        )
        await session.emit(
            "conversation.item.added", item=self.item.to_json(), previous_item_id=previous
        )
        await session.emit("response.content_part.added", part=part, **self._where())
        texts = generation.texts(pieces, self.tally)
        if not self.audio:
            async with aclosing(texts):
                async for text in texts:
                    self._add_text(text)
                    await session.emit("response.output_text.delta", delta=text, **self._where())
        else:
            await self._speak(texts, admission)
        if self.tally.finish_reasons.get(0) == "length":
            self.status = "incomplete"
            self.details = {"type": "incomplete", "reason": "max_output_tokens"}

    async def _speak(self, texts: AsyncGenerator[str, None], admission: Admission) -> None:
        session = self.session
        config = session.config
        voice = Voice(session.speech_model, config.voice, config.speed)
        backend = session.services.backend
        stream = spoken(backend, voice, texts, "pcm", admission.meter)
        async with aclosing(stream):
            async for piece in stream:
                if isinstance(piece, TextDelta):
                    self._add_text(piece.text)
                    await session.emit(
                        "response.output_audio_transcript.delta", delta=piece.text, **self._where()
                    )
                    continue
                if not self.item.spoken:
                    self._first_audio()
                if piece.seconds and (
                    not self.item.spoken or self.item.spoken[-1][1] != piece.sentence
                ):
                    self.item.spoken.append((round(self.audio_ms), piece.sentence))
                self.audio_ms += piece.seconds * 1000
                if piece.data:
                    await session.emit(
                        "response.output_audio.delta",
                        delta=base64.b64encode(piece.data).decode(),
                        **self._where(),
                    )

    def _first_audio(self) -> None:
        metrics = self.session.services.metrics
        if metrics is not None and self.response.turn_ended is not None:
            metrics.realtime_first_audio.observe(time.monotonic() - self.response.turn_ended)

    def _add_text(self, text: str) -> None:
        self.text.append(text)
        key = "transcript" if self.audio else "text"
        self.item.content[0][key] = "".join(self.text)

    async def _finish(self, admission: Admission) -> None:
        session = self.session
        services = session.services
        await services.limiter.finish(admission)
        if services.metrics is not None:
            services.metrics.realtime_responses.labels(session.config.model, self.status).inc()
            services.metrics.record_usage(admission)
        if self.started:
            self.item.status = "completed" if self.status == "completed" else "incomplete"
            where = self._where()
            text = "".join(self.text)
            if self.audio:
                await session.emit("response.output_audio.done", **where)
                await session.emit(
                    "response.output_audio_transcript.done", transcript=text, **where
                )
                part = {"type": "audio", "transcript": text}
            else:
                await session.emit("response.output_text.done", text=text, **where)
                part = {"type": "text", "text": text}
            await session.emit("response.content_part.done", part=part, **where)
            await session.emit(
                "response.output_item.done",
                response_id=self.response.id,
                output_index=0,
                item=self.item.to_json(),
            )
            await session.emit("conversation.item.done", item=self.item.to_json())
        await session.emit("response.done", response=self._json(self.status))


# --- helpers ----------------------------------------------------------------------------


def _object(value: object, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ClientEventError(f"{param} must be an object.", param=param)
    return value


def _b64(value: object, param: str) -> bytes:
    try:
        data = base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ClientEventError(
            f"{param} is not valid base64.", param=param, code="invalid_audio"
        ) from exc
    if len(data) % 2:
        raise ClientEventError(
            f"{param} must hold whole 16-bit samples (an even number of bytes).",
            param=param,
            code="invalid_audio",
        )
    return data


def _modalities(value: object, param: str) -> list[str]:
    if value not in (["audio"], ["text"]):
        raise ClientEventError("output_modalities must be ['audio'] or ['text'].", param=param)
    assert isinstance(value, list)
    return list(value)


def _pcm_to_stt(pcm: bytes) -> npt.NDArray[np.float32]:
    buffer = InputAudio()
    buffer.append(pcm)
    return buffer.take()


def _max_tokens(value: object, param: str) -> int | None:
    if value == "inf" or value is None:
        return None
    if not isinstance(value, int) or not 1 <= value <= 4096:
        raise ClientEventError(
            "max_output_tokens must be an integer from 1 to 4096, or 'inf'.", param=param
        )
    return value


def _check_format(value: object, param: str) -> None:
    if value is None:
        return
    spec = _object(value, param)
    kind = spec.get("type", "audio/pcm")
    if kind != "audio/pcm":
        raise ClientEventError(
            f"Audio format '{kind}' is not supported; use 'audio/pcm' (24 kHz pcm16).",
            param=f"{param}.type",
            code="unsupported_parameter",
        )
    if spec.get("rate", PCM_RATE) != PCM_RATE:
        raise ClientEventError(
            f"Audio rate {spec.get('rate')} is not supported; pcm16 is 24000 Hz.",
            param=f"{param}.rate",
        )
