"""A session's transcriptions: of the audio of its turns and of the ``input_audio`` parts
of its items, into the item's transcript and its events. Each request is admitted under
the key's limits once (the guesses made while a turn is spoken share its request) and
recorded with the seconds of audio it transcribed: every transcription of it that
completed, the guesses at the turn so far included, since each is work the model did.

The guesses each transcribe the turn from its start: Whisper hears the whole turn, as it
will at the end (transcribing only the audio since the last guess, with the text before
as its prompt, made a word in four or five wrong on the gateway's Whisper: see
docs/realtime.md). So that a speaker who pauses often makes neither the work nor the bill
grow with the square of the turn, a guess is made only while the audio the turn's guesses
sent stays within :data:`EARLY_WORK_FACTOR` times the turn's length (see
``turns.py``)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.backend import TranscriptionOptions
from gateway.errors import GatewayError
from gateway.serving.audio import STT_RATE
from gateway.serving.realtime.buffer import Audio
from gateway.serving.realtime.events import _TRANSCRIBES, Item, _Use

if TYPE_CHECKING:
    from gateway.serving.realtime.session import RealtimeSession
    from gateway.serving.realtime.speculation import Speculation
    from gateway.state.admission import Admission


@dataclass
class _EarlyTranscription:
    """A transcription started when the user fell silent, before the turn was committed
    (a guess): it is the turn's transcript if the turn ends on the audio it was made from."""

    from_ms: int
    voiced_windows: int  # the detector's mark when it was made
    task: asyncio.Task[str | None]
    speculation: Speculation | None = None
    """The answer to it, started once it was in."""

    def drop(self) -> None:
        self.task.cancel()
        if self.speculation is not None:
            self.speculation.drop()


#: A turn's guesses send the model at most this many times the turn's audio: with the
#: transcription at its end (when no guess covers it), a turn costs at most one more.
EARLY_WORK_FACTOR = 3


class _Transcription:
    """One transcription request: admitted under the key's limits once (the guesses made
    while a turn was spoken and the turn's own transcript share it), then recorded with the
    seconds of audio it transcribed."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.model = session.config.transcription_model
        uses = [(self.model, "session.audio.input.transcription.model", _TRANSCRIBES)]
        self.admitted = asyncio.create_task(_admitted(session, uses))
        self.finished = False
        self.sent_s = 0.0
        """Seconds of audio sent to the model under this request (what was stopped too)."""
        self.done_s = 0.0
        """Seconds of audio of its transcriptions that completed: what is recorded."""

    async def run(self, audio: Audio) -> str:
        """The transcript of ``audio``, once the request is admitted (a refusal raises)."""
        await asyncio.shield(self.admitted)
        seconds = audio.size / STT_RATE
        self.sent_s += seconds
        text = await _transcribe(self.session, self.model, audio)
        self.done_s += seconds
        return text

    async def finish(self) -> None:
        """Records the request (the first call only) with the audio it transcribed."""
        if self.finished:
            return
        self.finished = True
        self.session._transcriptions.discard(self)
        try:
            admission = await self.admitted
        except GatewayError:
            return  # refused: nothing ran
        admission.meter.audio_seconds_in += self.done_s
        await self.session.services.settle(admission)


async def _admitted(session: RealtimeSession, uses: list[_Use]) -> Admission:
    """The request admitted, and refused (429 ``budget_exceeded``, or ``budget_held``) when a
    budget of the key or its project is spent: its audio is not known yet, so nothing more
    is reserved."""
    admission = await session._admit(uses)
    try:
        await admission.meter.check_budget()
    except GatewayError:
        await session.services.finish(admission, True)
        raise
    return admission


async def _early_transcript(turn: _Transcription, audio: Audio) -> str | None:
    """A guess at the turn's transcript; None when it failed (the turn's own
    transcription, made at the commit, reports why)."""
    try:
        return await turn.run(audio)
    except GatewayError:
        return None


def _new_transcription(session: RealtimeSession) -> _Transcription:
    request = _Transcription(session)
    session._transcriptions.add(request)
    return request


async def _transcribe(session: RealtimeSession, model: str, audio: Audio) -> str:
    options = TranscriptionOptions(language=session.config.language, prompt=session.config.prompt)
    segments = session.services.backend.transcribe(model, audio, options)
    async with aclosing(segments):
        texts = [segment.text async for segment in segments]
    return "".join(texts).strip()


async def _transcript(
    session: RealtimeSession,
    audio: Audio,
    request: _Transcription | None = None,
    early: asyncio.Task[str | None] | None = None,
) -> str:
    """The transcript of ``audio``: ``early``'s (an early transcription's) if it has one,
    else made under ``request`` (a new request if none), which is then recorded."""
    request = request or _new_transcription(session)
    try:
        text = await early if early is not None else None
        if text is None:
            text = await request.run(audio)
        return text
    finally:
        await asyncio.shield(request.finish())


async def _transcribe_item(
    session: RealtimeSession,
    item: Item,
    audio: Audio,
    early: asyncio.Task[str | None] | None,
    request: _Transcription | None,
) -> None:
    index = item.audio_part()
    request = request or _new_transcription(session)
    try:
        transcript = await _transcript(session, audio, request, early)
    except GatewayError as exc:
        if session.config.transcribe_events:
            await session.emit(
                "conversation.item.input_audio_transcription.failed",
                item_id=item.id,
                content_index=index,
                error=exc.body()["error"],
            )
        else:
            await session.error(exc)
        await session.emit("conversation.item.done", item=item.to_json())
        return
    item.content[index]["transcript"] = transcript
    if session.config.transcribe_events:
        await session.emit(
            "conversation.item.input_audio_transcription.completed",
            item_id=item.id,
            content_index=index,
            transcript=transcript,
            # What was recorded: the audio of every transcription of the turn.
            usage={"type": "duration", "seconds": round(request.done_s, 3)},
        )
    await session.emit("conversation.item.done", item=item.to_json())
    await session.conversation._keep_bounded()
