"""Spoken answers: a chat model's text, spoken sentence by sentence while it is generated.

:func:`spoken` runs two things at once: the chat model's stream, whose text is handed on at
once (a transcript or text delta) and cut into sentences, and the speech model, which speaks
each sentence as soon as it is complete. So the first audio leaves after the first sentence,
long before the answer is finished, and synthesis of one sentence overlaps the generation
of the next. Closing the iterator cancels both Triton requests.

This is the gateway-side voice pipeline (speech -> text -> answer -> speech); why it runs
here and not as a Triton ensemble or BLS model is explained in the README ("How the voice
pieces connect").
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from gateway.backend import Backend
from gateway.serving.audio import StreamEncoder
from gateway.state.limits import Meter

# A sentence ends at . ! ? … (and closing quotes or brackets) followed by white space, or
# at a line break. Decimal points and "e.g." stay inside (no space after the dot).
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s+|\n+")
#: A long clause is spoken on its own at a comma, semicolon or colon: the first audio of a
#: long first sentence then comes sooner.
_CLAUSE_END = re.compile(r"[,;:]\s+")
LONG_CLAUSE = 60


class SentenceSplitter:
    """Cuts streamed text into speakable pieces."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, text: str) -> list[str]:
        self._pending += text
        pieces: list[str] = []
        while True:
            match = _SENTENCE_END.search(self._pending)
            if match is None and len(self._pending) > LONG_CLAUSE:
                clauses = list(_CLAUSE_END.finditer(self._pending))
                match = clauses[-1] if clauses else None
            if match is None:
                return pieces
            piece, self._pending = self._pending[: match.end()], self._pending[match.end() :]
            if piece.strip():
                pieces.append(piece.strip())

    def finish(self) -> list[str]:
        piece, self._pending = self._pending.strip(), ""
        return [piece] if piece else []


@dataclass(frozen=True)
class TextDelta:
    """Generated text, as it came."""

    text: str


@dataclass(frozen=True)
class SpokenAudio:
    """A piece of one sentence's audio, encoded (several per sentence are possible; an
    encoder may hold a piece's bytes back, so ``data`` can be empty). The encoder's last
    bytes come in a piece of their own, with no sentence and no seconds."""

    sentence: str
    seconds: float
    data: bytes


@dataclass(frozen=True)
class Voice:
    """Which speech model speaks, and how."""

    model: str
    voice: str
    speed: float = 1.0


Spoken = TextDelta | SpokenAudio
#: Pieces :func:`spoken` makes ahead of its reader.
AHEAD = 32

T = TypeVar("T")
_END = object()


class Handoff(Generic[T]):
    """Pieces from a producer to one reader, at most ``size`` of them waiting: the producer
    waits while the reader lags. Its end (with the error that ended it, if any) never waits,
    as the reader may be gone: a reader finds a full queue's end once it has read it."""

    def __init__(self, size: int) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(size)
        self._ended = False
        self._error: BaseException | None = None

    async def put(self, item: T) -> None:
        await self._queue.put(item)

    def end(self, error: BaseException | None = None) -> None:
        """No more pieces (the first call decides: ``error`` raises in the reader)."""
        if self._ended:
            return
        self._ended = True
        self._error = error
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(_END)

    async def items(self) -> AsyncGenerator[T, None]:
        while True:
            item = _END if self._ended and self._queue.empty() else await self._queue.get()
            if item is _END:
                if self._error is not None:
                    raise self._error
                return
            yield cast(T, item)


async def spoken(
    backend: Backend,
    voice: Voice,
    texts: AsyncGenerator[str, None],
    fmt: str,
    meter: Meter,
) -> AsyncGenerator[Spoken, None]:
    """Yields the text pieces of ``texts`` as they come and each sentence's audio, encoded
    in ``fmt`` (a speech ``response_format``), as soon as it is synthesized, in order of
    arrival; the seconds spoken go to ``meter``. An error in either raises here. At most
    :data:`AHEAD` pieces wait for the reader: past that, generating and speaking wait too
    (a reader that is slow, or not reading yet, holds no more than that)."""
    out: Handoff[Spoken] = Handoff(AHEAD)
    sentences: asyncio.Queue[str | None] = asyncio.Queue()

    async def generate() -> None:
        splitter = SentenceSplitter()
        async with aclosing(texts):
            async for text in texts:
                if not text:
                    continue
                await out.put(TextDelta(text))
                for sentence in splitter.feed(text):
                    await sentences.put(sentence)
        for sentence in splitter.finish():
            await sentences.put(sentence)
        await sentences.put(None)

    async def speak() -> None:
        encoder: StreamEncoder | None = None
        while (sentence := await sentences.get()) is not None:
            chunks = backend.synthesize(voice.model, sentence, voice.voice, voice.speed)
            async with aclosing(chunks):
                async for chunk in chunks:
                    if encoder is None:
                        encoder = StreamEncoder(fmt, chunk.sample_rate)
                    seconds = chunk.samples.size / chunk.sample_rate
                    meter.audio_seconds_out += seconds
                    data = await asyncio.to_thread(encoder.encode, chunk.samples)
                    await out.put(SpokenAudio(sentence, seconds, data))
        if encoder is not None:
            tail = await asyncio.to_thread(encoder.finish)
            if tail:
                await out.put(SpokenAudio("", 0.0, tail))

    async def both() -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(generate())
                group.create_task(speak())
        except BaseExceptionGroup as failed:
            out.end(failed.exceptions[0])
            return
        out.end()

    runner = asyncio.create_task(both())
    try:
        async for item in out.items():
            yield item
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
