"""A session's transcription requests: each admitted under the key's limits once (the
guesses made while a turn is spoken share its request) and recorded with the seconds of
audio it transcribed."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import GatewayError
from gateway.serving.realtime.buffer import Audio
from gateway.serving.realtime.events import _TRANSCRIBES

if TYPE_CHECKING:
    from gateway.serving.realtime.session import RealtimeSession


@dataclass
class _EarlyTranscription:
    """A transcription started when the user fell silent, before the turn was committed
    (a guess): it is the turn's transcript if the turn ends on the audio it was made from."""

    from_ms: int
    voiced_windows: int  # the detector's mark when it was made
    task: asyncio.Task[str | None]


class _Transcription:
    """One transcription request: admitted under the key's limits once (the guesses made
    while a turn was spoken and the turn's own transcript share it), then recorded with the
    seconds of audio it transcribed."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.model = session.config.transcription_model
        uses = [(self.model, "session.audio.input.transcription.model", _TRANSCRIBES)]
        self.admitted = asyncio.create_task(session._admit(uses))
        self.finished = False

    async def run(self, audio: Audio) -> str:
        """The transcript of ``audio``, once the request is admitted (a refusal raises)."""
        await asyncio.shield(self.admitted)
        return await self.session._transcribe(self.model, audio)

    async def finish(self, seconds: float) -> None:
        """Records the request (the first call only) with ``seconds`` of audio."""
        if self.finished:
            return
        self.finished = True
        self.session._transcriptions.discard(self)
        try:
            admission = await self.admitted
        except GatewayError:
            return  # refused: nothing ran
        admission.meter.audio_seconds_in += seconds
        await self.session.services.settle(admission)


async def _guessed(turn: _Transcription, audio: Audio) -> str | None:
    """A guess at the turn's transcript; None when it failed (the turn's own
    transcription, made at the commit, reports why)."""
    try:
        return await turn.run(audio)
    except GatewayError:
        return None
