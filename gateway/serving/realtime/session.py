"""A Realtime session: its settings (:class:`SessionConfig`, changed by
``session.update``), the state machine that acts on each client event in order and runs
the work on one worker task, and :class:`RealtimeServices`, what every session shares and
the factory that opens one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from gateway.backend import Backend, TranscriptionOptions
from gateway.config import Settings
from gateway.errors import GatewayError, InvalidRequestError
from gateway.metrics import Metrics
from gateway.serving.audio import STT_RATE
from gateway.serving.catalog import DefaultModels, ModelCatalog, model_takes
from gateway.serving.chat import ChatService
from gateway.serving.realtime.buffer import (
    MIN_COMMIT_MS,
    Audio,
    InputAudio,
    _b64,
    _check_seconds,
    _pcm_to_stt,
)
from gateway.serving.realtime.events import (
    _ANSWERS,
    _INPUT,
    _OUTPUT,
    _PART_FIELDS,
    _RESPONSE_FIELDS,
    _ROLE_PARTS,
    _SESSION_FIELDS,
    _SPEAKS,
    _TRANSCRIBES,
    MAX_ITEM_ID_CHARS,
    PCM_FORMAT,
    Bounds,
    ClientEventError,
    Item,
    _check_format,
    _fields,
    _id,
    _max_tokens,
    _metadata,
    _modalities,
    _object,
    _parse,
    _refuse_tools,
    _string,
    _unsupported,
    _Use,
)
from gateway.serving.realtime.responder import Response, _Responder
from gateway.serving.realtime.transcription import _EarlyTranscription, _guessed, _Transcription
from gateway.serving.speech import resolve_voice
from gateway.serving.vad import (
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    VadEvent,
    VadSettings,
)
from gateway.state.admission import Admission
from gateway.state.keys import ApiKey

logger = logging.getLogger("gateway.realtime")

Send = Callable[[dict[str, Any]], Awaitable[None]]

#: Transcriptions and responses a session may have waiting: a conversation has two at
#: most (a turn's transcription, then its answer); past it, an event that would add one is
#: refused, so a client cannot queue work (and the audio it holds) without end.
MAX_QUEUED_JOBS = 16

#: Model names of OpenAI's own that mean "the gateway's default" (``gpt-realtime``,
#: ``whisper-1``, ``gpt-4o-transcribe``...).
_OPENAI_MODEL_PREFIXES = ("gpt-", "whisper-")


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
    tool_choice: str = "auto"

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
            "tool_choice": self.tool_choice,
            "max_output_tokens": self.max_output_tokens or "inf",
            # A conversation that outgrows the model's context is not cut to fit: the
            # response fails with context_length_exceeded (OpenAI's "disabled").
            "truncation": "disabled",
            "tracing": None,
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


def _uses(config: SessionConfig, speech_model: str) -> list[_Use]:
    """The models ``config`` makes a session use: its chat model, the transcription model
    (any audio a client sends is transcribed for the chat model) and, for spoken answers,
    the speech model."""
    uses = [
        (config.model, "session.model", _ANSWERS),
        (config.transcription_model, "session.audio.input.transcription.model", _TRANSCRIBES),
    ]
    if config.output_modalities == ["audio"]:
        uses.append((speech_model, "session.output_modalities", _SPEAKS))
    return uses


#: Admits one more request of a session's caller under the key's limits as they are now,
#: without a concurrency slot of its own (the connection holds one): a 401 or 429 raises.
#: The API layer makes it from the key the connection presented, which the session never
#: sees.
Admit = Callable[[], Awaitable[Admission]]
#: Settles an admission once its request has ended: its tokens and usage (never raises).
Settle = Callable[[Admission], Awaitable[None]]


def _require(key: ApiKey, uses: list[_Use]) -> None:
    """403 unless ``key`` may use every model of ``uses``: the models a session uses
    without naming them are checked like the one it names."""
    for model, param, use in uses:
        key.require_model(model, param, use)


class RealtimeServices:
    """What every session shares."""

    def __init__(
        self,
        backend: Backend,
        catalog: ModelCatalog,
        chat: ChatService,
        models: DefaultModels,
        finish: Settle,
        settings: Settings,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.bounds = Bounds.of(settings)
        self.backend = backend
        self.catalog = catalog
        self.chat = chat
        self.models = models
        self.finish = finish
        self.metrics = metrics

    async def model_for(self, task: str, requested: str | None, param: str) -> str:
        """The model of ``task`` a session asked for: one of ours by name, or the default
        for one of OpenAI's names (``gpt-realtime``, ``whisper-1``...) or none; a 404 (or a
        400 for a model of another task) naming ``param`` for anything else."""
        if requested:
            found = await self.catalog.find(requested)
            if found is not None and found.task == task:
                return requested
            if not requested.startswith(_OPENAI_MODEL_PREFIXES):
                try:
                    await self.catalog.get(requested, task)  # raises the right 404 or 400
                except GatewayError as exc:
                    exc.param = param
                    raise
        return await self.models.pick(task)

    async def open(
        self, requested_model: str | None, key: ApiKey, admit: Admit, send: Send
    ) -> RealtimeSession:
        """A session of ``key`` (403 unless it may use the models the session will), whose
        requests ``admit`` lets in."""
        model = await self.model_for("chat", requested_model, "model")
        info = await self.models.info("speech")
        config = SessionConfig(
            model=model,
            voice=info.voices[0] if info.voices else "alloy",
            transcription_model=await self.models.pick("transcription"),
            instructions=self.settings.realtime_instructions,
            temperature=self.settings.realtime_temperature,
        )
        _require(key, _uses(config, info.name))
        return RealtimeSession(self, config, info.name, key, admit, send)

    async def settle(self, admission: Admission) -> None:
        """Records what a session's request used (never raises)."""
        await self.finish(admission)
        if self.metrics is not None:
            self.metrics.record_usage(admission)


_Handler = Callable[["RealtimeSession", dict[str, Any]], Awaitable[None]]


class RealtimeSession:
    def __init__(
        self,
        services: RealtimeServices,
        config: SessionConfig,
        speech_model: str,
        key: ApiKey,
        admit: Admit,
        send: Send,
    ) -> None:
        self.services = services
        self.config = config
        self.speech_model = speech_model
        self.key = key
        """The key the session was opened with: ``session.update`` checks models against
        it. Each request is admitted with the key as it is then (:meth:`_admit`)."""
        self._admit_request = admit
        self._send = send
        self.id = _id("sess")
        self.items: list[Item] = []
        self.buffer = InputAudio()
        self.detector: TurnDetector | None = (
            TurnDetector(config.vad) if config.vad is not None else None
        )
        self._speech_item: str | None = None  # the item id of the speech in progress
        self._speech_start_ms = 0
        self._guess: _EarlyTranscription | None = None
        self._turn: _Transcription | None = None
        """The transcription request of the speech in progress (made by its first guess)."""
        self._transcriptions: set[_Transcription] = set()
        """Transcription requests not yet recorded (recorded at the latest on close)."""
        self._jobs: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue(MAX_QUEUED_JOBS)
        self._worker: asyncio.Task[None] | None = None
        self.response: Response | None = None
        """The conversation's response, queued or running (one at a time)."""
        self.responses: dict[str, Response] = {}
        """Every response queued or running, out-of-band ones included."""
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
        """The connection is open: the session starts (and counts in the metrics)."""
        self._worker = asyncio.create_task(self._work())
        if self.services.metrics is not None:
            self.services.metrics.realtime_sessions.inc()
        await self.emit("session.created", session=self.config.to_json(self.id))

    async def close(self) -> None:
        """The connection is gone: stops the work in progress (and its Triton requests)
        and records the transcription requests not yet recorded."""
        if self.closed:
            return
        if self._worker is not None and self.services.metrics is not None:
            self.services.metrics.realtime_sessions.dec()
        self.closed = True
        for response in self.responses.values():
            if response.task is not None:
                response.task.cancel()
        self._drop_guess()
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for request in list(self._transcriptions):
            await request.finish(0.0)

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

    def _check_room(self) -> None:
        if self._jobs.full():
            raise ClientEventError(
                f"The session already has {MAX_QUEUED_JOBS} transcriptions and responses "
                "waiting; wait for them to finish.",
                code="too_many_pending_jobs",
            )

    async def _admit(self, uses: list[_Use]) -> Admission:
        """A request of this session (a response, a transcription) admitted under the key's
        limits like any request, without a concurrency slot of its own (the connection
        holds one), its models checked against the key; the first one names it in usage
        and metrics. A 429 or 403 raises here."""
        services = self.services
        admission = await self._admit_request()
        try:
            _require(admission.key, uses)
        except GatewayError:
            await services.finish(admission)
            raise
        admission.model = uses[0][0]
        return admission

    # --- client events ------------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> None:
        """Acts on one client event (the caller hands them over one at a time, in order);
        a bad one gets an ``error`` event, nothing more."""
        event_id = None
        try:
            limit = self.services.bounds.message_bytes
            if len(raw) > limit:
                raise ClientEventError(
                    f"The event is {len(raw):,} bytes; at most {limit:,} are allowed "
                    "(GATEWAY_REALTIME_MAX_MESSAGE_MB).",
                    code="message_too_large",
                )
            event = await _parse(raw)
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ClientEventError(
                    "An event must be a JSON object with a 'type'.", param="type"
                )
            event_id = event.get("event_id")
            found = self._handlers.get(event["type"])
            if found is None:
                raise ClientEventError(
                    f"Unknown event type '{event['type']}'.", param="type", code="invalid_event"
                )
            handler, fields = found
            _fields(event, "", {"type", "event_id", *fields})
            await handler(self, event)
        except GatewayError as exc:
            await self.error(exc, event_id if isinstance(event_id, str) else None)

    async def _session_update(self, event: dict[str, Any]) -> None:
        config = await self._configured(_object(event.get("session"), "session"))
        _require(self.key, _uses(config, self.speech_model))
        await self._apply(config)
        await self.emit("session.updated", session=config.to_json(self.id))

    async def _configured(self, spec: dict[str, Any]) -> SessionConfig:
        """The session's settings with ``spec`` (a ``session.update``'s session) applied:
        a new object, so a refused field leaves the session's own as they were."""
        _fields(spec, "session", _SESSION_FIELDS)
        kind = spec.get("type", "realtime")
        if kind != "realtime":
            raise ClientEventError(
                f"Session type '{kind}' is not supported; use 'realtime'.", param="session.type"
            )
        _refuse_tools(spec, "session")
        if spec.get("include"):
            raise _unsupported(
                "session.include",
                "Log probabilities of input transcriptions are not reported by this gateway.",
            )
        if spec.get("tracing") is not None:
            raise _unsupported(
                "session.tracing",
                "Tracing to OpenAI's dashboard does not exist here (the gateway's logs and "
                "metrics trace sessions); send null.",
            )
        if spec.get("truncation", "disabled") != "disabled":
            raise _unsupported(
                "session.truncation",
                "Only truncation 'disabled' is supported: a conversation that outgrows the "
                "model's context is not cut, the response fails with "
                "context_length_exceeded (delete items to make room).",
            )
        config = replace(self.config)
        if spec.get("model") is not None:
            requested = _string(spec["model"], "session.model")
            config.model = await self.services.model_for("chat", requested, "session.model")
        if "instructions" in spec:
            config.instructions = self._kept(spec["instructions"], "session.instructions")
        if "output_modalities" in spec:
            config.output_modalities = _modalities(
                spec["output_modalities"], "session.output_modalities"
            )
        if "max_output_tokens" in spec:
            config.max_output_tokens = _max_tokens(
                spec["max_output_tokens"], "session.max_output_tokens"
            )
        if spec.get("tool_choice") is not None:
            config.tool_choice = spec["tool_choice"]
        audio = _object(spec.get("audio") or {}, "session.audio")
        _fields(audio, "session.audio", {"input", "output"})
        await self._configure_input(config, _object(audio.get("input") or {}, _INPUT))
        await self._configure_output(config, _object(audio.get("output") or {}, _OUTPUT))
        return config

    async def _configure_input(self, config: SessionConfig, spec: dict[str, Any]) -> None:
        _fields(spec, _INPUT, {"format", "transcription", "noise_reduction", "turn_detection"})
        _check_format(spec.get("format"), f"{_INPUT}.format")
        if spec.get("noise_reduction") is not None:
            raise _unsupported(
                f"{_INPUT}.noise_reduction",
                "Noise reduction is not available in this gateway; send null.",
            )
        if "transcription" in spec:
            transcription = spec["transcription"]
            config.transcribe_events = transcription is not None
            if transcription is not None:
                where = f"{_INPUT}.transcription"
                await self._configure_transcription(config, _object(transcription, where))
        if "turn_detection" in spec:
            detection = spec["turn_detection"]
            if detection is None:
                config.vad = None
            else:
                _configure_vad(config, _object(detection, f"{_INPUT}.turn_detection"))

    async def _configure_transcription(self, config: SessionConfig, spec: dict[str, Any]) -> None:
        where = f"{_INPUT}.transcription"
        _fields(spec, where, {"model", "language", "prompt", "delay", "keywords", "languages"})
        for name in ("delay", "keywords", "languages"):
            if spec.get(name) is not None:
                raise _unsupported(
                    f"{where}.{name}",
                    f"'{name}' is not supported by this gateway's transcription models; "
                    "use 'language' and 'prompt'.",
                )
        if spec.get("model") is not None:
            requested = _string(spec["model"], f"{where}.model")
            config.transcription_model = await self.services.model_for(
                "transcription", requested, f"{where}.model"
            )
        info = await self.services.catalog.get(config.transcription_model, "transcription")
        language = self._kept(spec.get("language"), f"{where}.language")
        prompt = self._kept(spec.get("prompt"), f"{where}.prompt")
        if language and info.languages and language not in info.languages:
            raise ClientEventError(
                f"The model '{info.name}' does not transcribe language '{language}'; it "
                f"supports: {', '.join(info.languages)}.",
                param=f"{where}.language",
                code="unsupported_language",
            )
        # As /v1/audio/transcriptions: refused unless the operator lists it as ignored.
        if language and not model_takes(info, "language", f"{where}.language"):
            language = ""
        if prompt and not model_takes(info, "prompt", f"{where}.prompt"):
            prompt = ""
        config.language, config.prompt = language or None, prompt or None

    async def _configure_output(self, config: SessionConfig, spec: dict[str, Any]) -> None:
        _fields(spec, _OUTPUT, {"format", "voice", "speed"})
        _check_format(spec.get("format"), f"{_OUTPUT}.format")
        if "voice" in spec:
            config.voice = await self._voice(spec["voice"], f"{_OUTPUT}.voice")
        if "speed" in spec:
            speed = spec["speed"]
            param = f"{_OUTPUT}.speed"
            if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
                raise ClientEventError("speed must be a number from 0.25 to 4.0.", param=param)
            info = await self.services.catalog.get(self.speech_model, "speech")
            config.speed = float(speed) if model_takes(info, "speed", param) else 1.0

    async def _voice(self, value: object, param: str) -> str:
        """A voice of the session's speech model (an OpenAI voice name means its default)."""
        info = await self.services.catalog.get(self.speech_model, "speech")
        if isinstance(value, dict):
            _fields(value, param, {"id"})
            value = value.get("id")
        if not isinstance(value, str):
            raise ClientEventError("voice must be a voice name or {'id': name}.", param=param)
        try:
            return resolve_voice(value, info.voices)
        except InvalidRequestError as exc:
            raise ClientEventError(exc.message, param=param) from exc

    def _kept(self, value: object, param: str) -> str:
        """Text the session keeps (instructions, a prompt): a string (null: empty) of at
        most :attr:`Bounds.text_bytes`."""
        if value is None:
            return ""
        text = _string(value, param, empty=True)
        limit = self.services.bounds.text_bytes
        if len(text.encode("utf-8")) > limit:
            raise ClientEventError(
                f"{param} is longer than {limit:,} bytes, the most a session keeps "
                "(GATEWAY_MAX_STORED_KB).",
                param=param,
                code="string_above_max_length",
            )
        return text

    async def _apply(self, config: SessionConfig) -> None:
        """Makes ``config`` the session's; new VAD settings start a new detector where the
        audio is now (the speech in progress, if any, is forgotten)."""
        if config.vad != self.config.vad:
            self._drop_guess()
            await self._end_turn()
            self._speech_item = None
            self.detector = TurnDetector(config.vad, self.buffer.end) if config.vad else None
        self.config = config

    async def _append(self, event: dict[str, Any]) -> None:
        data = event.get("audio")
        if not isinstance(data, str):
            raise ClientEventError("audio must be base64-encoded pcm16.", param="audio")
        for found in await asyncio.to_thread(self._ingest, data):
            if isinstance(found, SpeechStarted):
                await self._speech_started(found.at_ms)
            elif isinstance(found, SpeechStopped):
                await self._speech_stopped(found.at_ms)
        detector = self.detector
        if detector is None:
            return
        if not detector.speaking:
            self.buffer.drop_before(detector.position_ms - detector.settings.prefix_padding_ms)
        elif self._guess is None:
            await self._maybe_guess()

    def _ingest(self, data: str) -> list[VadEvent]:
        """Decodes an append's audio, keeps it and runs the VAD over it: CPU work, run in a
        worker thread. Nothing else touches the buffer or the detector meanwhile, as the
        session handles one event at a time (so appends also stay in order). Past the
        buffer's bounds nothing is kept."""
        pcm = _b64(data, "audio")
        if not pcm:
            return []
        bounds = self.services.bounds
        size = self.buffer.pcm_bytes + len(pcm)
        if size > bounds.buffer_bytes:
            raise ClientEventError(
                f"The input audio buffer would hold {size:,} bytes of audio; at most "
                f"{bounds.buffer_bytes:,} are allowed (GATEWAY_REALTIME_MAX_BUFFER_MB). "
                "Commit or clear the buffer first.",
                param="audio",
                code="input_audio_buffer_full",
            )
        _check_seconds(size, bounds, "audio")
        audio = self.buffer.append(pcm)
        return self.detector.feed(audio) if self.detector is not None else []

    async def _maybe_guess(self) -> None:
        """When the user has gone quiet, transcribe the turn so far while the VAD waits."""
        detector = self.detector
        if detector is None or not detector.silent_ms or self._speech_item is None:
            return
        if detector.silent_ms < min(200, detector.settings.silence_duration_ms // 2):
            return
        from_ms = max(self._speech_start_ms, self.buffer.start_ms)
        audio = await asyncio.to_thread(self.buffer.audio, from_ms)
        if self._turn is None:
            self._turn = self._new_transcription()
        task = asyncio.create_task(_guessed(self._turn, audio))
        self._guess = _EarlyTranscription(from_ms, detector.voiced_windows, task)

    def _drop_guess(self) -> None:
        if self._guess is not None:
            self._guess.task.cancel()
            self._guess = None

    async def _end_turn(self) -> None:
        """The speech in progress will not be committed: its request, if a guess made one,
        is recorded with no audio."""
        turn, self._turn = self._turn, None
        if turn is not None:
            await turn.finish(0.0)

    def _new_transcription(self) -> _Transcription:
        request = _Transcription(self)
        self._transcriptions.add(request)
        return request

    async def _speech_started(self, at_ms: int) -> None:
        self._drop_guess()
        await self._end_turn()
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
        audio = await asyncio.to_thread(self.buffer.take, from_ms)
        turn, self._turn = self._turn, None
        self._speech_item = None
        await self._commit(item_id, audio, guess.task if guess else None, turn)
        if self.config.create_response:
            self._queue_response(await self._new_response({}), time.monotonic())

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
        turn, self._turn = self._turn, None
        if self.detector is not None:
            self.detector.reset()
        await self._commit(item_id, await asyncio.to_thread(self.buffer.take), None, turn)

    async def _clear(self, event: dict[str, Any]) -> None:
        self._drop_guess()
        await self._end_turn()
        self.buffer.clear()
        self._speech_item = None
        if self.detector is not None:
            self.detector.reset()
        await self.emit("input_audio_buffer.cleared")

    async def _commit(
        self,
        item_id: str,
        audio: Audio,
        guess: asyncio.Task[str | None] | None,
        turn: _Transcription | None,
    ) -> None:
        if self._jobs.full():
            if guess is not None:
                guess.cancel()
            if turn is not None:
                await turn.finish(0.0)
            self._check_room()
        previous = self.items[-1].id if self.items else None
        item = Item(item_id, "user", [{"type": "input_audio", "transcript": None}], "completed")
        self.items.append(item)
        await self.emit("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)
        await self.emit("conversation.item.added", item=item.to_json(), previous_item_id=previous)
        self._jobs.put_nowait(lambda: self._transcribe_item(item, audio, guess, turn))
        await self._keep_bounded()

    async def _transcribe(self, model: str, audio: Audio) -> str:
        options = TranscriptionOptions(language=self.config.language, prompt=self.config.prompt)
        segments = self.services.backend.transcribe(model, audio, options)
        async with aclosing(segments):
            texts = [segment.text async for segment in segments]
        return "".join(texts).strip()

    async def _transcript(
        self,
        audio: Audio,
        request: _Transcription | None = None,
        guess: asyncio.Task[str | None] | None = None,
    ) -> str:
        """The transcript of ``audio``: ``guess``'s if it has one, else made under
        ``request`` (a new request if none), which is then recorded."""
        request = request or self._new_transcription()
        seconds = 0.0
        try:
            text = await guess if guess is not None else None
            if text is None:
                text = await request.run(audio)
            seconds = audio.size / STT_RATE
            return text
        finally:
            await asyncio.shield(request.finish(seconds))

    async def _transcribe_item(
        self,
        item: Item,
        audio: Audio,
        guess: asyncio.Task[str | None] | None,
        request: _Transcription | None,
    ) -> None:
        index = item.audio_part()
        try:
            transcript = await self._transcript(audio, request, guess)
        except GatewayError as exc:
            if self.config.transcribe_events:
                await self.emit(
                    "conversation.item.input_audio_transcription.failed",
                    item_id=item.id,
                    content_index=index,
                    error=exc.body()["error"],
                )
            else:
                await self.error(exc)
            await self.emit("conversation.item.done", item=item.to_json())
            return
        item.content[index]["transcript"] = transcript
        if self.config.transcribe_events:
            await self.emit(
                "conversation.item.input_audio_transcription.completed",
                item_id=item.id,
                content_index=index,
                transcript=transcript,
                usage={"type": "duration", "seconds": round(audio.size / STT_RATE, 3)},
            )
        await self.emit("conversation.item.done", item=item.to_json())
        await self._keep_bounded()

    async def _item_create(self, event: dict[str, Any]) -> None:
        item, audio = await self._parse_item(_object(event.get("item"), "item"), "item")
        if any(existing.id == item.id for existing in self.items):
            raise ClientEventError(f"Item '{item.id}' already exists.", param="item.id")
        previous = event.get("previous_item_id")
        position = len(self.items)
        if previous == "root":
            position = 0
        elif previous:
            position = self._index(previous, "previous_item_id") + 1
        if audio is not None:
            self._check_room()
        prior = self.items[position - 1].id if position else None
        self.items.insert(position, item)
        await self.emit("conversation.item.added", item=item.to_json(), previous_item_id=prior)
        if audio is None:
            await self.emit("conversation.item.done", item=item.to_json())
        else:
            self._jobs.put_nowait(lambda: self._transcribe_item(item, audio, None, None))
        await self._keep_bounded()

    async def _parse_item(self, spec: dict[str, Any], param: str) -> tuple[Item, Audio | None]:
        """A message a client sent (an item to add, or one of a response's ``input``) and
        the audio of its ``input_audio`` part, decoded (in a worker thread)."""
        kind = spec.get("type", "message")
        if kind != "message":
            raise _unsupported(
                f"{param}.type", f"Items of type '{kind}' are not supported; send messages."
            )
        _fields(spec, param, {"type", "id", "object", "role", "status", "content"})
        item_id = spec.get("id") or _id("item")
        if not isinstance(item_id, str) or len(item_id) > MAX_ITEM_ID_CHARS:
            raise ClientEventError(
                f"id must be a string of at most {MAX_ITEM_ID_CHARS} characters.",
                param=f"{param}.id",
            )
        role = spec.get("role")
        if role not in _ROLE_PARTS:
            raise ClientEventError(
                "role must be 'user', 'assistant' or 'system'.", param=f"{param}.role"
            )
        content = spec.get("content")
        if not isinstance(content, list) or not content:
            raise ClientEventError("content must be a non-empty list.", param=f"{param}.content")
        parts: list[dict[str, Any]] = []
        audio: Audio | None = None
        allowed = _ROLE_PARTS[role]
        for index, part in enumerate(content):
            where = f"{param}.content[{index}]"
            part = _object(part, where)
            kind = part.get("type")
            if kind not in allowed:
                raise ClientEventError(
                    f"A {role} message takes parts of type {' or '.join(allowed)}.",
                    param=f"{where}.type",
                )
            _fields(part, where, _PART_FIELDS[kind])
            if kind in ("input_text", "output_text"):
                text = _string(part.get("text"), f"{where}.text", empty=True)
                parts.append({"type": kind, "text": text})
                continue
            if part.get("audio") is not None:
                if kind == "output_audio":
                    raise _unsupported(
                        f"{where}.audio",
                        "An assistant message's audio cannot be added (as in OpenAI's API); "
                        "send its transcript.",
                    )
                if audio is not None:
                    raise ClientEventError(
                        "A message takes one input_audio part.", param=f"{param}.content"
                    )
                audio = await asyncio.to_thread(self._decode, part["audio"], f"{where}.audio")
                parts.append({"type": kind, "transcript": None})
                continue
            transcript = _string(part.get("transcript"), f"{where}.transcript", empty=True)
            parts.append({"type": kind, "transcript": transcript})
        item = Item(item_id, role, parts)
        limit = self.services.bounds.text_bytes
        if item.size > limit:
            raise ClientEventError(
                f"The item holds {item.size:,} bytes of text; at most {limit:,} are allowed "
                "(GATEWAY_MAX_STORED_KB).",
                param=f"{param}.content",
                code="string_above_max_length",
            )
        return item, audio

    def _decode(self, data: object, param: str) -> Audio:
        """An ``input_audio`` part's audio, as 16 kHz samples (CPU work: run in a thread)."""
        pcm = _b64(data, param)
        _check_seconds(len(pcm), self.services.bounds, param)
        return _pcm_to_stt(pcm)

    def _index(self, item_id: object, param: str) -> int:
        for index, item in enumerate(self.items):
            if item.id == item_id:
                return index
        raise ClientEventError(
            f"Item with item_id '{item_id}' not found.", param=param, code="item_not_found"
        )

    async def _keep_bounded(self) -> None:
        """Drops the oldest items past :attr:`Bounds.items` items or
        :attr:`Bounds.text_bytes` of text, as OpenAI truncates a full conversation."""
        bounds = self.services.bounds
        while len(self.items) > bounds.items or (
            len(self.items) > 1 and sum(item.size for item in self.items) > bounds.text_bytes
        ):
            item = self.items.pop(0)
            await self.emit("conversation.item.deleted", item_id=item.id)

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
        if event.get("content_index", 0) != 0:
            raise ClientEventError(
                "content_index must be 0: an answer has one audio part.", param="content_index"
            )
        if not isinstance(end_ms, int) or end_ms < 0:
            raise ClientEventError(
                "audio_end_ms must be a non-negative integer.", param="audio_end_ms"
            )
        heard = [sentence for start, sentence in item.spoken if start < end_ms]
        item.spoken = item.spoken[: len(heard)]
        item.content = [{"type": "output_audio", "transcript": " ".join(heard)}]
        await self.emit(
            "conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=end_ms
        )

    # --- responses ----------------------------------------------------------------------

    async def _new_response(self, spec: dict[str, Any]) -> Response:
        """A response as ``spec`` (a ``response.create``'s response) asks, the session's
        settings for what it leaves out."""
        _fields(spec, "response", _RESPONSE_FIELDS)
        _refuse_tools(spec, "response")
        conversation = spec.get("conversation") or "auto"
        if conversation not in ("auto", "none"):
            raise ClientEventError(
                "conversation must be 'auto' or 'none'.", param="response.conversation"
            )
        modalities = self.config.output_modalities
        if spec.get("output_modalities") is not None:
            modalities = _modalities(spec["output_modalities"], "response.output_modalities")
        max_tokens = self.config.max_output_tokens
        if "max_output_tokens" in spec:
            max_tokens = _max_tokens(spec["max_output_tokens"], "response.max_output_tokens")
        instructions = self.config.instructions
        if spec.get("instructions") is not None:
            instructions = self._kept(spec["instructions"], "response.instructions")
        audio = _object(spec.get("audio") or {}, "response.audio")
        _fields(audio, "response.audio", {"output"})
        output = _object(audio.get("output") or {}, "response.audio.output")
        _fields(output, "response.audio.output", {"format", "voice"})
        _check_format(output.get("format"), "response.audio.output.format")
        voice = self.config.voice
        if output.get("voice") is not None:
            voice = await self._voice(output["voice"], "response.audio.output.voice")
        inputs = None
        if spec.get("input") is not None:
            inputs = await self._inputs(spec["input"])
        return Response(
            id=_id("resp"),
            model=self.config.model,
            modalities=modalities,
            instructions=instructions,
            max_output_tokens=max_tokens,
            voice=voice,
            conversation=conversation == "auto",
            input=inputs,
            metadata=_metadata(spec.get("metadata"), "response.metadata"),
        )

    async def _inputs(self, value: object) -> list[tuple[Item, Audio | None]]:
        """A response's ``input``: messages, and references to items of the conversation."""
        if not isinstance(value, list):
            raise ClientEventError("input must be a list of items.", param="response.input")
        limit = self.services.bounds.items
        if len(value) > limit:
            raise ClientEventError(
                f"input has {len(value)} items; at most {limit} are allowed "
                "(GATEWAY_REALTIME_MAX_ITEMS).",
                param="response.input",
            )
        inputs: list[tuple[Item, Audio | None]] = []
        for index, entry in enumerate(value):
            param = f"response.input[{index}]"
            spec = _object(entry, param)
            if spec.get("type") == "item_reference":
                _fields(spec, param, {"type", "id"})
                inputs.append((self.items[self._index(spec.get("id"), f"{param}.id")], None))
            else:
                inputs.append(await self._parse_item(spec, param))
        return inputs

    async def _response_create(self, event: dict[str, Any]) -> None:
        response = await self._new_response(_object(event.get("response") or {}, "response"))
        if response.conversation and self.response is not None:
            raise ClientEventError(
                f"Conversation already has an active response in progress: "
                f"{self.response.id}. Wait until the response is finished before creating "
                "a new one.",
                code="conversation_already_has_active_response",
            )
        self._queue_response(response, None)

    def _queue_response(self, response: Response, turn_ended: float | None) -> None:
        if response.conversation and self.response is not None:
            return  # one at a time; a VAD turn during a response that went on is heard next
        self._check_room()
        response.turn_ended = turn_ended
        if response.conversation:
            self.response = response
        self.responses[response.id] = response
        self._jobs.put_nowait(lambda: self._run_response(response))

    async def _response_cancel(self, event: dict[str, Any]) -> None:
        wanted = event.get("response_id")
        response = self.response if wanted is None else self.responses.get(wanted)
        if response is None:
            raise ClientEventError(
                "Cancellation failed: no active response found.",
                param=None if wanted is None else "response_id",
                code="response_cancel_not_active",
            )
        self._cancel(response, "client_cancelled")

    def _cancel(self, response: Response, reason: str) -> None:
        response.reason = reason
        if response.task is not None:
            response.task.cancel()
        else:
            self._forget(response)  # queued, not started: it never begins

    def _forget(self, response: Response) -> None:
        self.responses.pop(response.id, None)
        if self.response is response:
            self.response = None

    async def _run_response(self, response: Response) -> None:
        if self.responses.get(response.id) is not response:
            return
        response.task = asyncio.current_task()
        try:
            await _Responder(self, response).run()
        finally:
            self._forget(response)

    _handlers: ClassVar[dict[str, tuple[_Handler, frozenset[str]]]] = {
        "session.update": (_session_update, frozenset({"session"})),
        "input_audio_buffer.append": (_append, frozenset({"audio"})),
        "input_audio_buffer.commit": (_commit_event, frozenset()),
        "input_audio_buffer.clear": (_clear, frozenset()),
        "conversation.item.create": (_item_create, frozenset({"item", "previous_item_id"})),
        "conversation.item.delete": (_item_delete, frozenset({"item_id"})),
        "conversation.item.retrieve": (_item_retrieve, frozenset({"item_id"})),
        "conversation.item.truncate": (
            _item_truncate,
            frozenset({"item_id", "content_index", "audio_end_ms"}),
        ),
        "response.create": (_response_create, frozenset({"response"})),
        "response.cancel": (_response_cancel, frozenset({"response_id"})),
    }
    """Each client event's handler and its fields (besides ``type`` and ``event_id``)."""


def _configure_vad(config: SessionConfig, spec: dict[str, Any]) -> None:
    where = f"{_INPUT}.turn_detection"
    if spec.get("type", "server_vad") != "server_vad":
        raise _unsupported(
            f"{where}.type",
            f"Turn detection '{spec.get('type')}' is not supported; use 'server_vad' or null.",
        )
    _fields(
        spec,
        where,
        {
            "type",
            "threshold",
            "prefix_padding_ms",
            "silence_duration_ms",
            "create_response",
            "interrupt_response",
            "idle_timeout_ms",
        },
    )
    if spec.get("idle_timeout_ms") is not None:
        raise _unsupported(
            f"{where}.idle_timeout_ms", "idle_timeout_ms is not supported; send null."
        )
    base = config.vad or VadSettings()
    threshold = spec.get("threshold", base.threshold)
    padding = spec.get("prefix_padding_ms", base.prefix_padding_ms)
    silence = spec.get("silence_duration_ms", base.silence_duration_ms)
    if not isinstance(threshold, int | float) or not 0.0 <= threshold <= 1.0:
        raise ClientEventError("threshold must be from 0.0 to 1.0.", param=f"{where}.threshold")
    for name, value in (("prefix_padding_ms", padding), ("silence_duration_ms", silence)):
        if not isinstance(value, int) or not 0 <= value <= 10_000:
            raise ClientEventError(
                f"{name} must be an integer from 0 to 10000.", param=f"{where}.{name}"
            )
    for name in ("create_response", "interrupt_response"):
        if spec.get(name) not in (None, True, False):
            raise ClientEventError(f"{name} must be a boolean.", param=f"{where}.{name}")
    config.create_response = spec.get("create_response", config.create_response)
    config.interrupt_response = spec.get("interrupt_response", config.interrupt_response)
    config.vad = VadSettings(float(threshold), padding, silence)
