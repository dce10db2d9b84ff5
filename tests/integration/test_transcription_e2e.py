"""Speech to text end to end, fed by the real text-to-speech model: a round trip."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from openai.types.audio import TranscriptionSegment, TranscriptionVerbose

from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

SENTENCE = "The quick brown fox jumps over the lazy dog. It was a sunny day in the park."


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, start=1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / len(ref)


@pytest.fixture(scope="module")
def spoken(client: openai.OpenAI) -> bytes:
    return client.audio.speech.create(
        model="piper_tts", voice="alloy", input=SENTENCE, response_format="mp3"
    ).content


def test_round_trip_recovers_the_sentence(client: openai.OpenAI, spoken: bytes) -> None:
    result = client.audio.transcriptions.create(model="whisper_stt", file=("s.mp3", spoken))
    assert word_error_rate(SENTENCE, result.text) <= 0.3, result.text


def test_verbose_json_has_timed_segments_and_words(client: openai.OpenAI, spoken: bytes) -> None:
    result = client.audio.transcriptions.create(
        model="whisper_stt",
        file=("s.mp3", spoken),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert result.language == "english" and 3 < result.duration < 8
    assert result.segments and all(s.end > s.start for s in result.segments)
    starts = [w.start for w in result.words]
    assert len(result.words) >= 12 and starts == sorted(starts)
    assert word_error_rate(SENTENCE, " ".join(w.word for w in result.words)) <= 0.3


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitle_formats(stack: GatewayProcess, spoken: bytes, fmt: str) -> None:
    response = httpx.post(
        stack.base_url + "/v1/audio/transcriptions",
        data={"model": "whisper_stt", "response_format": fmt},
        files={"file": ("s.mp3", spoken)},
        timeout=60,
        headers=stack.headers,
    )
    assert response.status_code == 200
    sep = "," if fmt == "srt" else "."
    cue = rf"\d\d:\d\d:\d\d{re.escape(sep)}\d\d\d --> \d\d:\d\d:\d\d{re.escape(sep)}\d\d\d"
    assert len(re.findall(cue, response.text)) >= 1
    assert response.text.startswith("WEBVTT\n\n" if fmt == "vtt" else "1\n")
    assert word_error_rate(SENTENCE, re.sub(cue, " ", response.text)) <= 0.4


def test_streaming_transcription(stack: GatewayProcess, spoken: bytes) -> None:
    with httpx.stream(
        "POST",
        stack.base_url + "/v1/audio/transcriptions",
        data={"model": "whisper_stt", "stream": "true"},
        files={"file": ("s.mp3", spoken)},
        timeout=60,
        headers=stack.headers,
    ) as response:
        events = [json.loads(x[6:]) for x in response.iter_lines() if x.startswith("data: ")]
    assert events[-1]["type"] == "transcript.text.done"
    assert {e["type"] for e in events[:-1]} == {"transcript.text.delta"}
    assert "".join(e["delta"] for e in events[:-1]).strip() == events[-1]["text"]
    assert word_error_rate(SENTENCE, events[-1]["text"]) <= 0.3


def test_undecodable_upload_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.audio.transcriptions.create(model="whisper_stt", file=("x.wav", b"not audio"))
    assert raised.value.code == "invalid_audio"


def test_language_the_model_lacks_is_a_clear_error(client: openai.OpenAI, spoken: bytes) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.audio.transcriptions.create(
            model="whisper_stt", file=("s.mp3", spoken), language="fr"
        )
    assert raised.value.param == "language"
    assert raised.value.code == "unsupported_language"


def test_every_sdk_segment_field_comes_from_whisper(stack: GatewayProcess, spoken: bytes) -> None:
    """openai-python's TranscriptionSegment requires ten fields; whisper_stt sends them all
    (issue 36): reading the answer through the SDK's types must not raise."""
    response = httpx.post(
        stack.base_url + "/v1/audio/transcriptions",
        data={"model": "whisper_stt", "response_format": "verbose_json", "temperature": "0"},
        files={"file": ("s.mp3", spoken)},
        timeout=60,
        headers=stack.headers,
    )
    verbose = TranscriptionVerbose.model_validate(response.json())
    assert verbose.segments
    for raw, segment in zip(response.json()["segments"], verbose.segments, strict=True):
        assert set(raw) >= set(TranscriptionSegment.model_fields)
        assert isinstance(raw["seek"], int) and isinstance(raw["id"], int)
        # Whisper's token ids: text tokens (below its special ones, 50257 on), maybe with
        # the timestamp tokens around them, as OpenAI's whisper-1 sends them.
        assert segment.tokens and any(0 <= t < 50257 for t in segment.tokens)
        assert segment.temperature == 0.0 and segment.compression_ratio > 0
        assert segment.avg_logprob < 0 and 0 <= segment.no_speech_prob <= 1
        assert segment.seek >= 0 and segment.end > segment.start
