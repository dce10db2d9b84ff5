"""A session's input audio: ``input_audio_buffer.append`` (decoded, kept, heard by the
VAD), ``commit`` and ``clear``, and the effects of the turn state machine
(:mod:`~gateway.serving.realtime.turns`) carried out: guesses transcribed, turns committed
and answered, responses interrupted. Decoding, resampling and the VAD run in a worker
thread, one append after the other."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.serving import vad
from gateway.serving.audio import STT_RATE
from gateway.serving.realtime import turns
from gateway.serving.realtime.buffer import (
    MIN_COMMIT_MS,
    Audio,
    ClientAudio,
    InputAudio,
    check_seconds,
)
from gateway.serving.realtime.context import SessionContext
from gateway.serving.realtime.item_events import ItemEvents
from gateway.serving.realtime.protocol import (
    BufferAppend,
    BufferClear,
    BufferCommit,
    ClientEventError,
    new_id,
)
from gateway.serving.realtime.response_events import ResponseEvents
from gateway.serving.realtime.session_config import SessionConfig
from gateway.serving.realtime.speculation import Speculation
from gateway.serving.realtime.transcriber import Transcriber, TranscriptionRequest
from gateway.serving.vad import TurnDetector, VadEvent

logger = logging.getLogger(__name__)


@dataclass
class _Guessing:
    """A guess at the transcript of the speech in progress, and the answer to it."""

    task: asyncio.Task[str | None]
    heard: int
    """How many samples of the turn's audio it heard (from the turn's start)."""
    speculation: Speculation | None = None

    def drop(self) -> None:
        self.task.cancel()
        if self.speculation is not None:
            self.speculation.drop()


#: What of the audio after a guess is checked for sound (the tail of a word), and how loud
#: a 20 ms frame of it may be, against the turn's loudest frame, to count as quiet: 26 dB
#: below, which a soft consonant ("s", "f") is not and a quiet room's noise is.
TAIL_MS = 300
TAIL_RATIO = 0.05
_FRAME = STT_RATE // 50


def sound_after(audio: Audio, heard: int) -> bool:
    """Whether ``audio`` (a turn) has sound in the :data:`TAIL_MS` after its first ``heard``
    samples, which a guess transcribed: Silero VAD can take the soft end of a word for quiet,
    and a guess made at the first quiet window would then miss it (CPU work: a thread)."""
    tail = audio[heard : heard + TAIL_MS * STT_RATE // 1000]
    speech = audio[:heard]
    if tail.size < _FRAME or speech.size < _FRAME:
        return False
    loudest = float(np.sqrt(np.mean(np.square(_frames(speech)), axis=1)).max())
    return bool(np.sqrt(np.mean(np.square(_frames(tail)), axis=1)).max() > TAIL_RATIO * loudest)


def _frames(audio: Audio) -> Audio:
    whole = audio[: audio.size // _FRAME * _FRAME]
    return whole.reshape(-1, _FRAME)


class AudioEvents:
    """The input audio buffer of one session and where the user's speech is in it."""

    def __init__(
        self,
        ctx: SessionContext,
        item_events: ItemEvents,
        responses: ResponseEvents,
        transcriber: Transcriber,
    ) -> None:
        self.ctx = ctx
        self.item_events = item_events
        self.responses = responses
        self.transcriber = transcriber
        config = ctx.config
        self.client_audio = ClientAudio(config.input_format)
        self.buffer = InputAudio()
        self.detector = TurnDetector(config.vad) if config.vad is not None else None
        self.state = turns.TurnState()
        self.guesses: dict[int, _Guessing] = {}
        self.request: TranscriptionRequest | None = None
        """The transcription request of the speech in progress (made by its first guess)."""

    def handlers(self) -> dict[type[Any], Any]:
        return {BufferAppend: self.append, BufferCommit: self.commit, BufferClear: self.clear}

    async def reconfigure(self, config: SessionConfig) -> None:
        """The session's settings change to ``config``: new VAD settings start a new
        detector where the audio is now (the speech in progress, if any, is forgotten); a
        new input format, a new decoder."""
        if config.input_format != self.ctx.config.input_format:
            self.client_audio = ClientAudio(config.input_format)
        if config.vad != self.ctx.config.vad:
            await self._feed(turns.Restarted())
            self.detector = TurnDetector(config.vad, self.buffer.end) if config.vad else None

    # --- client events ------------------------------------------------------------------

    async def append(self, event: BufferAppend) -> None:
        for found in await asyncio.to_thread(self._ingest, event.audio):
            if isinstance(found, vad.SpeechStarted):
                await self._feed(
                    turns.SpeechStarted(
                        found.at_ms,
                        new_id("item"),
                        responding=self.responses.active is not None,
                        interrupt=self.ctx.config.interrupt_response,
                    )
                )
            elif isinstance(found, vad.SpeechStopped):
                await self._feed(
                    turns.SpeechStopped(
                        found.at_ms,
                        self.detector.voiced_windows if self.detector is not None else -1,
                        self.buffer.start_ms,
                        respond=self.ctx.config.create_response and self.ctx.config.answers,
                        item_id=new_id("item"),
                    )
                )
        detector = self.detector
        if detector is not None:
            await self._feed(
                turns.Listened(
                    speaking=detector.speaking,
                    silent_ms=detector.silent_ms,
                    voiced_windows=detector.voiced_windows,
                    position_ms=detector.position_ms,
                    padding_ms=detector.settings.prefix_padding_ms,
                    silence_ms=detector.settings.silence_duration_ms,
                    buffer_start_ms=self.buffer.start_ms,
                    buffer_end_ms=self.buffer.end_ms,
                )
            )

    def _ingest(self, data: str) -> list[VadEvent]:
        """Decodes an append's audio, keeps it and runs the VAD over it: CPU work, run in a
        worker thread. Nothing else touches the buffer or the detector meanwhile, as the
        session handles one event at a time (so appends also stay in order). Past the
        buffer's bounds nothing is kept."""
        bounds = self.ctx.services.bounds
        # Checked before decoding, against what the append will become (G.711: 6 times it).
        size = self.buffer.pcm_bytes + self.client_audio.pcm16_bytes(len(data))
        if size > bounds.buffer_bytes:
            raise ClientEventError(
                f"The input audio buffer would hold {size:,} bytes of audio; at most "
                f"{bounds.buffer_bytes:,} are allowed (GATEWAY_REALTIME_MAX_BUFFER_MB). "
                "Commit or clear the buffer first.",
                param="audio",
                code="input_audio_buffer_full",
            )
        check_seconds(size, bounds, "audio")
        pcm = self.client_audio.pcm16(data, "audio")
        if not pcm:
            return []
        audio = self.buffer.append(pcm)
        return self.detector.feed(audio) if self.detector is not None else []

    async def commit(self, event: BufferCommit) -> None:
        held = self.buffer.end_ms - self.buffer.start_ms
        if held < MIN_COMMIT_MS:
            raise ClientEventError(
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {held}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        await self._feed(turns.CommitAsked(new_id("item")))

    async def clear(self, event: BufferClear) -> None:
        self.buffer.clear()
        if self.detector is not None:
            self.detector.reset()
        await self._feed(turns.Cleared())

    # --- the turn's effects -------------------------------------------------------------

    async def _feed(self, happened: turns.Happening) -> None:
        self.state, effects = turns.step(self.state, happened)
        for effect in effects:
            await self._do(effect)

    async def _do(self, effect: turns.Effect) -> None:
        if isinstance(effect, turns.ServerEvent):
            await self.ctx.emit(effect.kind, **effect.fields)
        elif isinstance(effect, turns.Trim):
            self.buffer.drop_before(effect.before_ms)
        elif isinstance(effect, turns.DropGuess):
            guessing = self.guesses.pop(effect.number, None)
            if guessing is not None:
                guessing.drop()
        elif isinstance(effect, turns.EndRequest):
            request, self.request = self.request, None
            if request is not None:
                await request.finish()
        elif isinstance(effect, turns.StartGuess):
            if effect.new_request or self.request is None:
                self.request = self.transcriber.request()
            audio = await asyncio.to_thread(self.buffer.audio, effect.from_ms)
            task = asyncio.create_task(self._guess(effect.number, self.request, audio))
            self.guesses[effect.number] = _Guessing(task, audio.size)
        elif isinstance(effect, turns.Answer):
            guessing = self.guesses.get(effect.number)
            if guessing is not None and guessing.speculation is None:
                guessing.speculation = await self.responses.ahead(effect.text)
        elif isinstance(effect, turns.Interrupt):
            self.responses.interrupt()
        else:
            await self._commit(effect)

    async def _guess(self, number: int, request: TranscriptionRequest, audio: Audio) -> str | None:
        """The early transcript; once it is in, the answer to it is started ahead when the
        turn, if it ends here, will be answered by itself."""
        text = await self.transcriber.guess(request, audio)
        can_answer = self.ctx.config.create_response and self.responses.active is None
        try:
            await self._feed(turns.GuessHeard(number, text, can_answer and not self.ctx.closed))
        except Exception:  # the guess is still the turn's transcript
            logger.exception("could not start the answer to a guessed turn")
        return text

    async def _commit(self, commit: turns.Commit) -> None:
        guessing = self.guesses.pop(commit.guess, None) if commit.guess is not None else None
        request = self.request if commit.with_request else None
        self.request = None
        if commit.from_ms is None and self.detector is not None:
            self.detector.reset()
        audio = await asyncio.to_thread(self.buffer.take, commit.from_ms)
        if guessing is not None and await asyncio.to_thread(sound_after, audio, guessing.heard):
            guessing.drop()  # the end of a word the VAD took for quiet: not heard by it
            guessing = None
        speculation = guessing.speculation if guessing is not None else None
        try:
            early = guessing.task if guessing is not None else None
            await self.item_events.commit_turn(commit.item_id, audio, early, request)
        except BaseException:
            if speculation is not None:
                speculation.drop()
            raise
        if commit.respond:
            await self.responses.for_turn(speculation, time.monotonic())
        elif speculation is not None:
            speculation.drop()

    async def close(self) -> None:
        for guessing in self.guesses.values():
            guessing.drop()
        self.guesses.clear()
