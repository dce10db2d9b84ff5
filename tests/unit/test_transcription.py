"""/v1/audio/transcriptions with the fake backend: decoding, formats, streaming, errors."""

from __future__ import annotations

import io
import json
import re

import av
import httpx
import numpy as np
import openai
import pytest

from gateway.backend.fake import FakeBackend
from tests.unit.conftest import assert_openai_error, make_settings, serve

URL = "/v1/audio/transcriptions"


def tone_file(seconds: float, fmt: str = "wav", rate: int = 44_100) -> bytes:
    """A stereo tone encoded with PyAV, as a user's recording would be."""
    out = io.BytesIO()
    with av.open(out, mode="w", format=fmt) as container:
        codec = {"wav": "pcm_s16le", "mp3": "libmp3lame", "ogg": "libopus"}[fmt]
        stream = container.add_stream(codec, rate=48_000 if fmt == "ogg" else rate)
        stream.layout = "stereo"
        samples = (np.sin(np.arange(int(seconds * stream.rate)) / 10) * 8000).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(
            np.stack([samples, samples]).reshape(1, -1), format="s16", layout="stereo"
        )
        frame.sample_rate = stream.rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["wav", "mp3", "ogg"])
async def test_any_container_is_decoded_to_16k_mono(
    client: openai.AsyncOpenAI, fake: FakeBackend, fmt: str
) -> None:
    result = await client.audio.transcriptions.create(
        model="fake-stt", file=(f"a.{fmt}", tone_file(2.5, fmt))
    )
    assert result.text == "Segment 1 says hello. Segment 2 says hello. Segment 3 says hello."
    audio = fake.transcribe_calls[-1][1]
    assert audio.dtype == np.float32 and abs(audio.size / 16_000 - 2.5) < 0.1


async def test_text_srt_and_vtt(http: httpx.AsyncClient) -> None:
    files = {"file": ("a.wav", tone_file(2.0))}
    text = await http.post(URL, data={"model": "fake-stt", "response_format": "text"}, files=files)
    assert text.headers["content-type"].startswith("text/plain")
    assert text.text == "Segment 1 says hello. Segment 2 says hello.\n"
    srt = (
        await http.post(URL, data={"model": "fake-stt", "response_format": "srt"}, files=files)
    ).text
    assert re.fullmatch(
        r"1\n00:00:00,000 --> 00:00:01,000\nSegment 1 says hello\.\n\n"
        r"2\n00:00:01,000 --> 00:00:02,000\nSegment 2 says hello\.\n\n",
        srt,
    )
    vtt = (
        await http.post(URL, data={"model": "fake-stt", "response_format": "vtt"}, files=files)
    ).text
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nSegment 1 says hello.\n")


async def test_verbose_json_with_words_and_segments(client: openai.AsyncOpenAI) -> None:
    result = await client.audio.transcriptions.create(
        model="fake-stt",
        file=("a.wav", tone_file(2.0)),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert result.language == "english" and abs(result.duration - 2.0) < 0.05
    assert [s.text for s in result.segments] == [" Segment 1 says hello.", " Segment 2 says hello."]
    starts = [w.start for w in result.words]
    assert len(result.words) == 8 and starts == sorted(starts)
    assert all(w.end >= w.start for w in result.words)


async def test_stream_sends_deltas_then_done(http: httpx.AsyncClient) -> None:
    response = await http.post(
        URL, data={"model": "fake-stt", "stream": "true"}, files={"file": ("a.wav", tone_file(2.0))}
    )
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 2 + ["transcript.text.done"]
    assert events[-1]["text"] == "Segment 1 says hello. Segment 2 says hello."


@pytest.mark.parametrize(
    ("content", "fields", "param"),
    [
        (b"this is not audio", {}, "file"),
        (b"", {}, "file"),
        (None, {"temperature": "3"}, "temperature"),
        (None, {"response_format": "docx"}, "response_format"),
        (None, {"timestamp_granularities[]": "word"}, "timestamp_granularities[]"),
        (None, {"language": "fr"}, "language"),
    ],
)
async def test_bad_uploads_are_400(
    http: httpx.AsyncClient,
    fake: FakeBackend,
    content: bytes | None,
    fields: dict[str, str],
    param: str,
) -> None:
    data = {"model": "fake-stt", **fields}
    files = {"file": ("a.wav", tone_file(1.0) if content is None else content)}
    assert_openai_error(await http.post(URL, data=data, files=files), 400, param=param)
    assert fake.transcribe_calls == []


async def test_an_upload_over_the_limit_is_413() -> None:
    fake = FakeBackend()
    async with serve(make_settings(max_audio_upload_mb=0.05), fake) as (_, http, _client):
        response = await http.post(
            URL, data={"model": "fake-stt"}, files={"file": ("a.wav", tone_file(2.0))}
        )
    assert_openai_error(response, 413, code="file_too_large", param="file")


async def test_transcription_needs_a_transcription_model(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        await client.audio.transcriptions.create(model="fake-chat", file=("a.wav", tone_file(1)))


async def test_translations_say_clearly_they_are_not_supported(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        await client.audio.translations.create(model="fake-stt", file=("a.wav", tone_file(1)))
    assert raised.value.code == "not_supported"
