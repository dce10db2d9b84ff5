"""Text to speech end to end: the openai client -> gateway -> Triton -> Piper."""

from __future__ import annotations

import time

import numpy as np
import openai
import pytest

from gateway.serving.audio import FORMATS
from tests.support.audio import decode

pytestmark = pytest.mark.integration

SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_is_real_speech(client: openai.OpenAI, fmt: str) -> None:
    response = client.audio.speech.create(
        model="piper_tts", voice="alloy", input=SENTENCE, response_format=fmt
    )
    assert response.response.headers["content-type"] == FORMATS[fmt].content_type
    samples, rate = decode(response.content, fmt)
    duration = len(samples) / rate
    # Nine words of English take about two to four seconds to say.
    assert 1.5 < duration < 5.0, duration
    assert np.sqrt(np.mean(samples**2)) > 0.02, "the audio is silent"


def test_speed_changes_the_duration(client: openai.OpenAI) -> None:
    def seconds(speed: float) -> float:
        audio = client.audio.speech.create(
            model="piper_tts", voice="alloy", input=SENTENCE, response_format="pcm", speed=speed
        ).content
        return len(audio) / 2 / 24_000

    normal, fast = seconds(1.0), seconds(2.0)
    # Not 0.5: Piper draws each phoneme's length with noise (noise_w), so the ratio varies
    # from call to call (0.59 to 0.66 over 8 tries here), and the silence it adds does not
    # scale with speed. Twice as fast is still clearly shorter, never longer.
    assert 0.4 < fast / normal < 0.72


def test_first_audio_arrives_before_a_long_text_is_synthesized(client: openai.OpenAI) -> None:
    text = " ".join(f"This is sentence number {n} of a longer text." for n in range(1, 9))
    start = time.perf_counter()
    first_byte = None
    size = 0
    with client.audio.speech.with_streaming_response.create(
        model="piper_tts", voice="alloy", input=text, response_format="pcm"
    ) as response:
        for piece in response.iter_bytes():
            first_byte = first_byte or time.perf_counter() - start
            size += len(piece)
    total = time.perf_counter() - start
    assert first_byte is not None and size / 2 / 24_000 > 10  # eight sentences of speech
    assert first_byte < total / 2, f"first byte at {first_byte:.2f} s of {total:.2f} s"


def test_unknown_voice_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.audio.speech.create(model="piper_tts", voice="robot", input=SENTENCE)
    assert raised.value.param == "voice"
