"""A session's spoken turns: the input audio buffer and the VAD over it, the events that
feed and empty them (``input_audio_buffer.append``, ``commit``, ``clear``), the
transcription guessed while the user falls silent, barge-in, and the end of a turn: a
user item committed (its audio transcribed) and, with ``server_vad``, answered."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from gateway.serving.audio import STT_RATE
from gateway.serving.realtime.buffer import (
    MIN_COMMIT_MS,
    Audio,
    InputAudio,
    _b64,
    _check_seconds,
)
from gateway.serving.realtime.events import ClientEventError, Item, _id
from gateway.serving.realtime.responder import (
    _cancel,
    _new_response,
    _queue_response,
    chat_request,
    response_uses,
)
from gateway.serving.realtime.speculation import Speculation
from gateway.serving.realtime.transcription import (
    EARLY_WORK_FACTOR,
    _early_transcript,
    _EarlyTranscription,
    _new_transcription,
    _Transcription,
)
from gateway.serving.vad import SpeechStarted, SpeechStopped, TurnDetector, VadEvent, VadSettings

if TYPE_CHECKING:
    from gateway.serving.realtime.session import RealtimeSession

logger = logging.getLogger(__name__)

#: How long the user must have been quiet before the turn so far is transcribed (and then
#: answered, ahead: see speculation.py); half of ``silence_duration_ms`` when that is less.
#: A pause is not guessed at where the turn's guesses would send the model more than
#: ``EARLY_WORK_FACTOR`` times the turn's audio (see transcription.py).
GUESS_AFTER_MS = 200


class Turns:
    """The turns of one session: its input audio and where the user's speech is in it."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        config = session.config
        self.buffer = InputAudio()
        self.detector: TurnDetector | None = (
            TurnDetector(config.vad) if config.vad is not None else None
        )
        self._speech_item: str | None = None  # the item id of the speech in progress
        self._speech_start_ms = 0
        self._early_transcription: _EarlyTranscription | None = None
        self._turn: _Transcription | None = None
        """The transcription request of the speech in progress (made by its first guess)."""

    async def _restart(self, vad: VadSettings | None) -> None:
        """New VAD settings: a new detector where the audio is now (the speech in progress,
        if any, is forgotten)."""
        self._drop_early_transcription()
        await self._end_turn()
        self._speech_item = None
        self.detector = TurnDetector(vad, self.buffer.end) if vad else None

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
            return
        early = self._early_transcription
        if early is not None and early.voiced_windows != detector.voiced_windows:
            # The user went on after a pause: the guess, and the answer to it, are stale.
            self._drop_early_transcription()
        if self._early_transcription is None:
            await self._maybe_transcribe_early()

    def _ingest(self, data: str) -> list[VadEvent]:
        """Decodes an append's audio, keeps it and runs the VAD over it: CPU work, run in a
        worker thread. Nothing else touches the buffer or the detector meanwhile, as the
        session handles one event at a time (so appends also stay in order). Past the
        buffer's bounds nothing is kept."""
        pcm = _b64(data, "audio")
        if not pcm:
            return []
        bounds = self.session.services.bounds
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

    async def _maybe_transcribe_early(self) -> None:
        """When the user has gone quiet, transcribe the turn so far while the VAD waits."""
        detector = self.detector
        if detector is None or not detector.silent_ms or self._speech_item is None:
            return
        if detector.silent_ms < min(GUESS_AFTER_MS, detector.settings.silence_duration_ms // 2):
            return
        from_ms = max(self._speech_start_ms, self.buffer.start_ms)
        skip = max(0, from_ms * STT_RATE // 1000 - self.buffer.start)
        seconds = (self.buffer.size - skip) / STT_RATE
        sent = self._turn.sent_s if self._turn is not None else 0.0
        if sent + seconds > EARLY_WORK_FACTOR * seconds:
            return  # this pause goes unguessed (the turn is transcribed at its end if it ends)
        audio = await asyncio.to_thread(self.buffer.audio, from_ms)
        if self._turn is None:
            self._turn = _new_transcription(self.session)
        task = asyncio.create_task(self._guess(self._turn, audio))
        self._early_transcription = _EarlyTranscription(from_ms, detector.voiced_windows, task)

    async def _guess(self, turn: _Transcription, audio: Audio) -> str | None:
        """The early transcript, and the answer to it started at once (see
        :mod:`~gateway.serving.realtime.speculation`) when the turn, if it ends here, will
        be answered by itself."""
        text = await _early_transcript(turn, audio)
        early = self._early_transcription
        session = self.session
        if (
            text
            and early is not None
            and early.task is asyncio.current_task()
            and session.config.create_response
            and session.response is None
            and not session.closed
        ):
            try:
                response = await _new_response(session, {})
                items = [*session.conversation.items, _guessed_item(text)]
                request = chat_request(session, response, items)
                audio_out = response.modalities == ["audio"]
                uses = response_uses(session, response)
                early.speculation = Speculation(session, request, response.voice, audio_out, uses)
            except Exception:  # the guess is still the turn's transcript
                logger.exception("could not start the answer to a guessed turn")
        return text

    def _drop_early_transcription(self) -> None:
        if self._early_transcription is not None:
            self._early_transcription.drop()
            self._early_transcription = None

    async def _end_turn(self) -> None:
        """The speech in progress will not be committed: its request, if a guess made one,
        is recorded with what its guesses transcribed."""
        turn, self._turn = self._turn, None
        if turn is not None:
            await turn.finish()

    async def _speech_started(self, at_ms: int) -> None:
        self._drop_early_transcription()
        await self._end_turn()
        self._speech_item = _id("item")
        self._speech_start_ms = at_ms
        await self.session.emit(
            "input_audio_buffer.speech_started", audio_start_ms=at_ms, item_id=self._speech_item
        )
        if self.session.config.interrupt_response and self.session.response is not None:
            _cancel(self.session, self.session.response, "turn_detected")

    async def _speech_stopped(self, at_ms: int) -> None:
        item_id = self._speech_item or _id("item")
        await self.session.emit(
            "input_audio_buffer.speech_stopped", audio_end_ms=at_ms, item_id=item_id
        )
        early = self._early_transcription
        self._early_transcription = None
        from_ms = max(self._speech_start_ms, self.buffer.start_ms)
        voiced = self.detector.voiced_windows if self.detector is not None else -1
        if early is not None and (early.from_ms != from_ms or early.voiced_windows != voiced):
            early.drop()
            early = None
        speculation = early.speculation if early is not None else None
        audio = await asyncio.to_thread(self.buffer.take, from_ms)
        turn, self._turn = self._turn, None
        self._speech_item = None
        session = self.session
        response = None
        try:
            await session._commit(item_id, audio, early.task if early else None, turn)
            if session.config.create_response:
                response = await _new_response(session, {})
        finally:
            if speculation is not None and response is None:
                speculation.drop()
        if response is not None:
            # The turn's response takes the answer made ahead, or drops it if it asks
            # otherwise (or never starts).
            response.speculation = speculation
            _queue_response(session, response, time.monotonic())

    async def _commit_event(self, event: dict[str, Any]) -> None:
        if self.buffer.end_ms - self.buffer.start_ms < MIN_COMMIT_MS:
            raise ClientEventError(
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has "
                f"{self.buffer.end_ms - self.buffer.start_ms}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        self._drop_early_transcription()
        item_id = self._speech_item or _id("item")
        self._speech_item = None
        turn, self._turn = self._turn, None
        if self.detector is not None:
            self.detector.reset()
        await self.session._commit(item_id, await asyncio.to_thread(self.buffer.take), None, turn)

    async def _clear(self, event: dict[str, Any]) -> None:
        self._drop_early_transcription()
        await self._end_turn()
        self.buffer.clear()
        self._speech_item = None
        if self.detector is not None:
            self.detector.reset()
        await self.session.emit("input_audio_buffer.cleared")


def _guessed_item(transcript: str) -> Item:
    """The user item a turn ending now would add, with its guessed transcript."""
    return Item(
        _id("item"), "user", [{"type": "input_audio", "transcript": transcript}], "completed"
    )
