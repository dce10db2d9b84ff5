"""A session's transcriptions: of the audio of its turns and of the ``input_audio`` parts
of its items, into the item's transcript and its events (a ``delta`` per segment as the
model decodes it, then ``completed``). Each request is admitted under the key's limits
once (the guesses made while a turn is spoken share its request) and recorded with the
seconds of audio it transcribed: every transcription of it that completed, the guesses at
the turn so far included, since each is work the model did.

The guesses each transcribe the turn from its start: Whisper hears the whole turn, as it
will at the end (transcribing only the audio since the last guess, with the text before
as its prompt, made a word in four or five wrong on the gateway's Whisper: see
docs/realtime.md). :mod:`~gateway.serving.realtime.turns` bounds how many are made."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import aclosing

from gateway.backend import TranscriptionOptions
from gateway.errors import GatewayError
from gateway.serving.audio import STT_RATE
from gateway.serving.realtime.buffer import Audio
from gateway.serving.realtime.context import AdmitUses, Emit, Services
from gateway.serving.realtime.items import TRANSCRIBES, Item
from gateway.serving.realtime.session_config import SessionConfig
from gateway.state.admission import Admission

#: Called with each piece of a transcript as the model decodes it.
OnText = Callable[[str], Awaitable[None]]


class TranscriptionRequest:
    """One transcription request: admitted under the key's limits once (the guesses made
    while a turn was spoken and the turn's own transcript share it), then recorded with the
    seconds of audio it transcribed."""

    def __init__(
        self,
        services: Services,
        admit: AdmitUses,
        config: SessionConfig,
        done: Callable[[TranscriptionRequest], None],
    ) -> None:
        self.services = services
        self.model = config.transcription_model
        self.options = TranscriptionOptions(language=config.language, prompt=config.prompt)
        uses = [(self.model, "session.audio.input.transcription.model", TRANSCRIBES)]
        self.admitted = asyncio.create_task(self._admitted(admit, uses))
        self.finished = False
        self.sent_s = 0.0
        """Seconds of audio sent to the model under this request (what was stopped too)."""
        self.done_s = 0.0
        """Seconds of audio of its transcriptions that completed: what is recorded."""
        self._done = done

    async def _admitted(self, admit: AdmitUses, uses: list[tuple[str, str, str]]) -> Admission:
        """The request admitted, and refused (429 ``budget_exceeded``, or ``budget_held``)
        when a budget of the key or its project is spent: its audio is not known yet, so
        nothing more is reserved."""
        admission = await admit(uses, True)
        try:
            await admission.meter.check_budget()
        except GatewayError:
            await self.services.refuse(admission)
            raise
        return admission

    async def run(self, audio: Audio, on_text: OnText | None = None) -> str:
        """The transcript of ``audio``, once the request is admitted (a refusal raises)."""
        await asyncio.shield(self.admitted)
        seconds = audio.size / STT_RATE
        self.sent_s += seconds
        segments = self.services.backend.transcribe(self.model, audio, self.options)
        texts: list[str] = []
        async with aclosing(segments):
            async for segment in segments:
                text = segment.text if texts else segment.text.lstrip()
                texts.append(text)
                if on_text is not None and text:
                    await on_text(text)
        self.done_s += seconds
        return "".join(texts).strip()

    async def finish(self) -> None:
        """Records the request (the first call only) with the audio it transcribed."""
        if self.finished:
            return
        self.finished = True
        self._done(self)
        try:
            admission = await self.admitted
        except GatewayError:
            return  # refused: nothing ran
        admission.meter.audio_seconds_in += self.done_s
        await self.services.settle(admission)


class Transcriber:
    """A session's transcriptions, made with its settings as they are when each starts."""

    def __init__(
        self,
        services: Services,
        admit: AdmitUses,
        config: Callable[[], SessionConfig],
        emit: Emit,
        error: Callable[[GatewayError], Awaitable[None]],
    ) -> None:
        self.services = services
        self.admit = admit
        self.config = config
        self.emit = emit
        self.error = error
        self.open: set[TranscriptionRequest] = set()
        """Requests not yet recorded (recorded at the latest on close)."""

    def request(self) -> TranscriptionRequest:
        made = TranscriptionRequest(self.services, self.admit, self.config(), self.open.discard)
        self.open.add(made)
        return made

    async def guess(self, request: TranscriptionRequest, audio: Audio) -> str | None:
        """A guess at a turn's transcript; None when it failed (the turn's own
        transcription, made at the commit, reports why)."""
        try:
            return await request.run(audio)
        except GatewayError:
            return None

    async def transcript(
        self,
        audio: Audio,
        request: TranscriptionRequest | None = None,
        early: asyncio.Task[str | None] | None = None,
        on_text: OnText | None = None,
    ) -> str:
        """The transcript of ``audio``: ``early``'s (a guess's) if it has one, else made
        under ``request`` (a new request if none), which is then recorded."""
        request = request or self.request()
        try:
            text = await early if early is not None else None
            if text is None:
                return await request.run(audio, on_text)
            if on_text is not None and text:
                await on_text(text)
            return text
        finally:
            await asyncio.shield(request.finish())

    async def item(
        self,
        item: Item,
        audio: Audio,
        early: asyncio.Task[str | None] | None,
        request: TranscriptionRequest | None,
    ) -> None:
        """Transcribes an item's audio into its ``input_audio`` part, with its events."""
        index = item.audio_part()
        request = request or self.request()
        events = self.config().transcribe_events
        where = {"item_id": item.id, "content_index": index}

        async def delta(text: str) -> None:
            if events:
                await self.emit(
                    "conversation.item.input_audio_transcription.delta", delta=text, **where
                )

        try:
            transcript = await self.transcript(audio, request, early, delta)
        except GatewayError as exc:
            if events:
                await self.emit(
                    "conversation.item.input_audio_transcription.failed",
                    error=exc.body()["error"],
                    **where,
                )
            else:
                await self.error(exc)
            return
        item.content[index]["transcript"] = transcript
        if events:
            await self.emit(
                "conversation.item.input_audio_transcription.completed",
                transcript=transcript,
                # What was recorded: the audio of every transcription of the turn.
                usage={"type": "duration", "seconds": round(request.done_s, 3)},
                **where,
            )

    async def close(self) -> None:
        for request in list(self.open):
            await request.finish()
