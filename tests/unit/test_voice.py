"""The voice pieces on the fake backend: sentence cutting and spoken answers (Realtime
sessions are in ``test_realtime.py``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import pytest

from gateway.backend.fake import FakeBackend
from gateway.serving.voice import (
    AHEAD,
    SentenceSplitter,
    SpokenAudio,
    TextDelta,
    Voice,
    spoken,
)
from gateway.state.limits import Meter


def test_sentences_are_cut_where_they_end() -> None:
    splitter = SentenceSplitter()
    pieces = [*splitter.feed("It costs 3.5 euros. Re"), *splitter.feed("ally? Yes!\nNext")]
    assert pieces == ["It costs 3.5 euros.", "Really?", "Yes!"]
    assert splitter.finish() == ["Next"]
    assert splitter.finish() == []


def test_a_long_clause_is_spoken_on_its_own() -> None:
    splitter = SentenceSplitter()
    text = "When the gateway hears a long first sentence, it speaks the clause, then the rest"
    assert splitter.feed(text) == [
        "When the gateway hears a long first sentence, it speaks the clause,"
    ]
    assert splitter.finish() == ["then the rest"]


async def words(text: str) -> AsyncGenerator[str, None]:
    """``text`` a word at a time, at a model's pace (10 ms a token)."""
    for word in text.split(" "):
        await asyncio.sleep(0.01)
        yield word + " "


async def test_text_streams_and_each_sentence_is_spoken() -> None:
    fake = FakeBackend()
    voice = Voice("fake-tts", "joe")
    meter = Meter()
    first_audio_out = asyncio.Event()

    async def model() -> AsyncGenerator[str, None]:
        """The answer's first sentence, then (as a slow model would) the rest only once the
        first sentence is heard, or after 5 s, when a test that waited for the whole text
        before speaking fails below: no timing makes this test pass or fail."""
        async for word in words("One two."):
            yield word
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(first_audio_out.wait(), 5)
        yield "Three. "

    pieces = []
    async for piece in spoken(fake, voice, model(), "pcm", meter):
        pieces.append(piece)
        if isinstance(piece, SpokenAudio) and piece.seconds:
            first_audio_out.set()
    text = "".join(p.text for p in pieces if isinstance(p, TextDelta))
    assert text == "One two. Three. "
    audio = [p for p in pieces if isinstance(p, SpokenAudio) and p.seconds]
    assert [a.sentence for a in audio] == ["One two.", "Three."]
    # FakeBackend speaks 0.5 s per sentence, encoded as 24 kHz pcm16.
    assert meter.audio_seconds_out == pytest.approx(1.0)
    pcm = b"".join(p.data for p in pieces if isinstance(p, SpokenAudio))
    assert len(pcm) / 2 / 24_000 == pytest.approx(1.0, abs=0.01)
    assert [call[1] for call in fake.speech_calls] == ["One two.", "Three."]
    # The first sentence's audio comes before the last words of the text.
    first_audio = pieces.index(audio[0])
    assert first_audio < max(i for i, p in enumerate(pieces) if isinstance(p, TextDelta))


async def test_a_spoken_answer_not_read_waits_instead_of_piling_up() -> None:
    fake = FakeBackend()
    produced: list[str] = []

    async def endless() -> AsyncGenerator[str, None]:
        while True:
            await asyncio.sleep(0)
            produced.append("x")
            yield "Word. "

    stream = spoken(fake, Voice("fake-tts", "joe"), endless(), "pcm", Meter())
    assert isinstance(await anext(stream), TextDelta)
    await asyncio.sleep(0.2)  # nobody reads: a few pieces ahead, then generating waits
    assert len(produced) <= AHEAD + 2
    pieces = [await anext(stream) for _ in range(3 * AHEAD)]  # and it goes on when read
    assert any(isinstance(p, SpokenAudio) for p in pieces)
    await stream.aclose()


async def test_closing_a_spoken_answer_stops_generating() -> None:
    fake = FakeBackend()
    produced: list[str] = []

    async def endless() -> AsyncGenerator[str, None]:
        while True:
            await asyncio.sleep(0.001)
            produced.append("x")
            yield "Word. "

    stream = spoken(fake, Voice("fake-tts", "joe"), endless(), "pcm", Meter())
    assert isinstance(await anext(stream), TextDelta)
    await stream.aclose()
    count = len(produced)
    await asyncio.sleep(0.05)
    assert len(produced) == count
