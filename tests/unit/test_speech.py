"""/v1/audio/speech with the fake backend: formats, voices, streaming, errors."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import httpx
import numpy as np
import openai
import pytest

from gateway.backend.fake import FakeBackend
from gateway.serving.audio import FORMATS
from tests.support.audio import decode
from tests.support.bodies import assert_openai_error

SPEECH = "/v1/audio/speech"
TEXT = "One sentence. Two sentences. Three sentences."


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_every_format_decodes_back_to_the_spoken_audio(
    client: openai.AsyncOpenAI, fmt: str
) -> None:
    response = await client.audio.speech.create(
        model="fake-tts", input=TEXT, voice="alloy", response_format=fmt
    )
    assert response.response.headers["content-type"] == FORMATS[fmt].content_type
    samples, rate = decode(response.content, fmt)
    duration = len(samples) / rate
    assert 1.4 <= duration <= 1.7, duration  # three 0.5 s sentences (+ codec padding)
    assert np.sqrt(np.mean(samples**2)) > 0.05, "the audio is silent"


async def test_speed_scales_the_duration(client: openai.AsyncOpenAI) -> None:
    response = await client.audio.speech.create(
        model="fake-tts", input=TEXT, voice="alloy", response_format="wav", speed=2.0
    )
    samples, rate = decode(response.content, "wav")
    assert 0.7 <= len(samples) / rate <= 0.8


async def test_openai_voices_map_onto_the_default_voice(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    await client.audio.speech.create(model="fake-tts", input="Hi.", voice="nova")
    await client.audio.speech.create(model="fake-tts", input="Hi.", voice="amy")
    assert [call[2] for call in fake.speech_calls] == ["joe", "amy"]


async def test_audio_streams_sentence_by_sentence(stream_http: httpx.AsyncClient) -> None:
    body = {"model": "fake-tts", "input": TEXT, "voice": "alloy", "response_format": "pcm"}
    async with stream_http.stream("POST", SPEECH, json=body) as response:
        assert response.status_code == 200
        pieces = [piece async for piece in response.aiter_raw()]
    assert len(pieces) >= 3, "each sentence should be sent when it is ready"


async def test_sse_stream_format_sends_base64_deltas_then_done(http: httpx.AsyncClient) -> None:
    body = {
        "model": "fake-tts",
        "input": TEXT,
        "voice": "alloy",
        "response_format": "pcm",
        "stream_format": "sse",
    }
    response = await http.post(SPEECH, json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert abs(len(audio) / 2 / 24_000 - 1.5) < 0.05


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"voice": "robot"}, "voice"),
        ({"input": ""}, "input"),
        ({"input": "x" * 4097}, "input"),
        ({"speed": 5}, "speed"),
        ({"speed": 0.1}, "speed"),
        ({"response_format": "ogg"}, "response_format"),
        ({"stream_format": "chunks"}, "stream_format"),
    ],
)
async def test_bad_speech_requests_are_400(
    http: httpx.AsyncClient, fake: FakeBackend, fields: dict[str, object], param: str
) -> None:
    body = {"model": "fake-tts", "input": "Hello.", "voice": "alloy", **fields}
    assert_openai_error(await http.post(SPEECH, json=body), 400, param=param)
    assert fake.speech_calls == []


async def test_speech_needs_a_speech_model(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        await client.audio.speech.create(model="fake-chat", input="Hi.", voice="alloy")
    assert raised.value.code == "model_not_supported"
    with pytest.raises(openai.NotFoundError):
        await client.audio.speech.create(model="nope", input="Hi.", voice="alloy")


async def test_failure_before_the_first_sentence_is_a_real_error(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.fail_after_tokens = 0
    body = {"model": "fake-tts", "input": TEXT, "voice": "alloy"}
    assert_openai_error(await http.post(SPEECH, json=body), 500, code="model_error")


async def test_instructions_a_voice_cannot_follow_are_accepted_and_listed_as_ignored(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    """fake-tts, like piper_tts, has one style: the same words are read, without them."""
    plain = await client.audio.speech.create(model="fake-tts", voice="alloy", input=TEXT)
    styled = await client.audio.speech.create(
        model="fake-tts", voice="alloy", input=TEXT, instructions="Whisper it."
    )
    assert styled.content == plain.content
    assert fake.speech_calls[-1] == fake.speech_calls[-2] == ("fake-tts", TEXT, "joe", 1.0)
    assert fake.speech_instructions == [None, None]
    listed = await client.models.retrieve("fake-tts")
    assert listed.model_extra is not None
    assert listed.model_extra["ignored_parameters"] == ["instructions"]
    assert "instructions" not in listed.model_extra["parameters"]


async def test_instructions_reach_a_model_that_takes_them(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    styled = replace(
        next(m for m in fake.model_list if m.name == "fake-tts"),
        name="fake-tts-styled",
        takes=frozenset({"speed", "instructions"}),
        ignores=frozenset(),
    )
    fake.model_list.append(styled)
    await client.audio.speech.create(
        model="fake-tts-styled", voice="alloy", input=TEXT, instructions="Whisper it."
    )
    assert fake.speech_instructions == ["Whisper it."]
    listed = await client.models.retrieve("fake-tts-styled")
    assert listed.model_extra is not None and "instructions" in listed.model_extra["parameters"]


async def test_instructions_are_refused_by_a_model_that_neither_takes_nor_ignores_them(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    """Only a model whose profile cannot tell (none serves speech today) and whose operator
    did not list them in openai_ignore."""
    strict = replace(
        next(m for m in fake.model_list if m.name == "fake-tts"),
        name="fake-tts-strict",
        ignores=frozenset(),
    )
    fake.model_list.append(strict)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.speech.create(
            model="fake-tts-strict", voice="alloy", input=TEXT, instructions="Whisper it."
        )
    assert refused.value.body["param"] == "instructions"  # type: ignore[index]
    assert refused.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    assert not fake.speech_calls
