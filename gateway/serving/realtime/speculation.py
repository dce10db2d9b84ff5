"""A turn's answer started before the turn is confirmed.

With ``server_vad`` a turn ends when the user has been silent for ``silence_duration_ms``
(500 ms by default), and the answer could only start then. Instead, once the early guess at
the transcript is in (:mod:`~gateway.serving.realtime.transcription`, made when the user
went quiet), the answer the turn would get is started at once: the chat model generates and
the voice speaks the first sentences, and what they make is kept, not sent. When the turn
ends on the audio the guess was made from, the response of the turn takes what was made
(if it asks exactly what was guessed: the same messages, model, voice and token budget)
and sends it, then goes on live. When the user speaks again first, or anything else changes,
the speculation is cancelled (its Triton requests with it) and dropped.

What a dropped speculation used is never recorded: it was not a request of the client's.
What an adopted one used is counted in the response that took it, under that response's
admission (its rate limits and its reservation, made as for any response). A session has
at most one speculation at a time, bounded by the response's own ``max_output_tokens``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from gateway.serving import generation
from gateway.serving.protocol import ChatCompletionRequest
from gateway.serving.voice import Voice, spoken
from gateway.state.limits import Meter

if TYPE_CHECKING:
    from gateway.serving.realtime.session import RealtimeSession

#: What a response asks of the models, compared to tell whether a speculation is its answer.
Ask = tuple[str, str, tuple[str, ...], float]

_END = object()


def ask_of(
    session: RealtimeSession, request: ChatCompletionRequest, voice: str, audio: bool
) -> Ask:
    return (
        request.model_dump_json(exclude_none=True),
        voice if audio else "",
        (session.speech_model,) if audio else (),
        session.config.speed if audio else 0.0,
    )


class Speculation:
    """The answer to a guessed turn, made ahead and kept until taken or dropped."""

    def __init__(
        self,
        session: RealtimeSession,
        request: ChatCompletionRequest,
        voice: str,
        audio: bool,
    ) -> None:
        self.session = session
        self.ask = ask_of(session, request, voice, audio)
        self.meter = Meter()
        """What it used; added to the adopting response's meter when that one settles."""
        self.run: generation.GenerationRun | None = None
        self._outcome: str | None = None
        self._reserved = asyncio.Event()
        """Set once ``run`` exists (or it failed before)."""
        self._made: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.create_task(self._make(request, voice, audio))

    async def _make(self, request: ChatCompletionRequest, voice: str, audio: bool) -> None:
        session = self.session
        services = session.services
        try:
            chat = await services.chat.prepare(request)
            self.run = await services.chat.reserve_run(chat, self.meter)
            self._reserved.set()
            texts = generation.texts(await self.run.stream(), self.run, chat.reasoning())
            made: AsyncGenerator[Any, None] = texts
            if audio:
                speaker = Voice(session.speech_model, voice, session.config.speed)
                made = spoken(services.backend, speaker, texts, "pcm", self.meter)
            async with aclosing(made):
                async for piece in made:
                    self._made.put_nowait(piece)
            self._made.put_nowait(_END)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # told to the response that takes it, in its place
            self._made.put_nowait(exc)
        finally:
            self._reserved.set()

    async def matches(self, ask: Ask, run: generation.GenerationRun) -> bool:
        """Whether this is the answer a response asking ``ask`` would make with ``run``
        (its generations as reserved: a budget cut short by the key's ``tpm`` differs).
        One that failed before it began generating is not (the response tries anew)."""
        if ask != self.ask:
            return False
        await self._reserved.wait()
        return self.run is not None and run.generations == self.run.generations

    def _count(self, outcome: str) -> None:
        if self._outcome is None:
            self._outcome = outcome
            metrics = self.session.services.metrics
            if metrics is not None:
                metrics.realtime_speculations.labels(outcome).inc()

    def pieces(self) -> AsyncGenerator[Any, None]:
        """Takes it: what it made, then what it makes, to the end (an error it met raises
        there)."""
        self._count("taken")
        return self._pieces()

    async def _pieces(self) -> AsyncGenerator[Any, None]:
        try:
            while True:
                piece = await self._made.get()
                if piece is _END:
                    return
                if isinstance(piece, BaseException):
                    raise piece
                yield piece
        finally:
            self.drop()

    def drop(self) -> None:
        """Stops it (and its Triton requests); unless taken, what it used is not recorded."""
        self._count("dropped")
        self._task.cancel()

    def settle_into(self, meter: Meter) -> None:
        """Counts what it used in the adopting response's ``meter``."""
        meter.add_tokens(self.meter.prompt_tokens, self.meter.completion_tokens)
        meter.audio_seconds_out += self.meter.audio_seconds_out
