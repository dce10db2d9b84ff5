"""What one request can make the gateway do is bounded (docs/limits.md), and every model a
request makes the gateway use is checked against the caller's key."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncGenerator

import httpx
import pytest
from fastapi import FastAPI

from gateway.backend import ChatImage, GenerationChunk, SamplingOptions
from gateway.backend.fake import FakeBackend
from gateway.serving.audio_chat import MAX_AUDIO_PARTS
from tests.support.asgi import asgi_scope, leave_once
from tests.support.audio import tone_file
from tests.support.backends import SlowTranscription
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import AUTH, BASE_URL, bearer, make_settings, new_key, serve

VOICE_MODELS = ["fake-chat", "fake-tts", "fake-stt"]


def audio_part(seconds: float) -> dict[str, object]:
    data = base64.b64encode(tone_file(seconds)).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


async def test_a_huge_fan_out_is_refused_at_once_and_nothing_reaches_the_model(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    body = {"model": "fake-chat", "prompt": ["hi"] * 5000, "n": 128}
    started = time.monotonic()
    refused = await http.post("/v1/completions", json=body)
    assert time.monotonic() - started < 1
    error = assert_openai_error(refused, 400, param="prompt", code="too_many_prompts")
    assert "GATEWAY_MAX_PROMPTS" in error["message"]
    too_many = await http.post(
        "/v1/completions", json={"model": "fake-chat", "prompt": ["a", "b", "c"], "n": 50}
    )
    error = assert_openai_error(too_many, 400, param="n", code="too_many_choices")
    assert "150 generations" in error["message"]
    assert fake.calls == []


async def test_chat_n_is_bounded_by_the_choices_setting(fake: FakeBackend) -> None:
    async with serve(make_settings(max_choices=4), fake) as (_, http, _sdk):
        refused = await http.post("/v1/chat/completions", json=chat_body(n=5))
        assert_openai_error(refused, 400, param="n", code="too_many_choices")
        assert (await http.post("/v1/chat/completions", json=chat_body(n=4))).status_code == 200


class CountingBackend(FakeBackend):
    """Counts the generations running at once."""

    running: int = 0
    most: int = 0

    async def generate(
        self,
        model: str,
        prompt: str,
        options: SamplingOptions,
        stream: bool,
        images: tuple[ChatImage, ...] = (),
    ) -> AsyncGenerator[GenerationChunk, None]:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.01)
            async for chunk in super().generate(model, prompt, options, stream, images):
                yield chunk
        finally:
            self.running -= 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_keeps_at_most_its_share_of_triton_requests_in_flight(
    stream: bool,
) -> None:
    backend = CountingBackend()
    backend.token_delay_s = 0.005
    settings = make_settings(max_inflight_per_request=3)
    async with serve(settings, backend) as (_, http, _sdk):
        body = {"model": "fake-chat", "prompt": ["one", "two"], "n": 5, "stream": stream}
        response = await http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
    assert len(backend.calls) == 10  # every choice was generated ...
    assert backend.most == 3  # ... never more than three at a time


async def test_a_body_past_the_limit_is_refused_before_it_is_read(fake: FakeBackend) -> None:
    async with serve(make_settings(max_request_mb=0.01), fake) as (_, http, _sdk):
        big = chat_body(messages=[{"role": "user", "content": "x" * 20_000}])
        refused = await http.post("/v1/chat/completions", json=big)
        error = assert_openai_error(refused, 413, code="request_too_large")
        assert "GATEWAY_MAX_REQUEST_MB" in error["message"]

        async def chunks() -> AsyncGenerator[bytes, None]:  # no Content-Length: chunked
            for _ in range(20):
                yield b" " * 1024
            yield b'{"model": "fake-chat"}'

        chunked = await http.post("/v1/chat/completions", content=chunks())
        assert_openai_error(chunked, 413, code="request_too_large")
        small = await http.post("/v1/chat/completions", json=chat_body())
        assert small.status_code == 200
    assert fake.calls == [fake.calls[-1]]  # only the small request reached the model


async def test_decoded_audio_is_bounded_in_seconds(fake: FakeBackend) -> None:
    settings = make_settings(models=VOICE_MODELS, max_audio_seconds=2)
    async with serve(settings, fake) as (_, http, _sdk):
        files = {"file": ("long.wav", tone_file(3), "audio/wav")}
        refused = await http.post(
            "/v1/audio/transcriptions", data={"model": "fake-stt"}, files=files
        )
        error = assert_openai_error(refused, 400, param="file")
        assert "GATEWAY_MAX_AUDIO_SECONDS" in error["message"]
        part = await http.post(
            "/v1/chat/completions",
            json=chat_body(messages=[{"role": "user", "content": [audio_part(3)]}]),
        )
        assert "GATEWAY_MAX_AUDIO_SECONDS" in assert_openai_error(part, 400)["message"]
        assert fake.transcribe_calls == []


async def test_models_the_voice_chain_uses_are_checked_against_the_key(
    fake: FakeBackend,
) -> None:
    async with serve(make_settings(models=VOICE_MODELS), fake) as (_, admin, _sdk):
        key = (await new_key(admin, models=["fake-chat"]))["key"]
        heard = await admin.post(
            "/v1/chat/completions",
            json=chat_body(messages=[{"role": "user", "content": [audio_part(0.5)]}]),
            headers=bearer(key),
        )
        error = assert_openai_error(heard, 403, code="model_not_allowed")
        assert "'fake-stt'" in error["message"]
        assert error["param"] == "messages.[0].content.[0].input_audio"
        spoken = await admin.post(
            "/v1/chat/completions",
            json=chat_body(modalities=["text", "audio"], audio={"voice": "alloy"}),
            headers=bearer(key),
        )
        error = assert_openai_error(spoken, 403, code="model_not_allowed")
        assert "'fake-tts'" in error["message"]
        assert fake.transcribe_calls == [] and fake.speech_calls == [] and fake.calls == []
        # A key that may use all three gets its spoken answer.
        everything = (await new_key(admin, models=VOICE_MODELS))["key"]
        allowed = await admin.post(
            "/v1/chat/completions",
            json=chat_body(modalities=["text", "audio"], audio={"voice": "alloy"}),
            headers=bearer(everything),
        )
        assert allowed.status_code == 200, allowed.text


async def test_a_large_body_is_read_only_for_a_valid_key(
    anon: httpx.AsyncClient, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # FastAPI parses a body before the key is checked: a large one waits for the key.
    big = chat_body(messages=[{"role": "user", "content": "x" * 2_000_000}])
    refused = await anon.post("/v1/chat/completions", json=big)
    assert_openai_error(refused, 401, code="invalid_api_key")
    wrong = await anon.post(
        "/v1/chat/completions", json=big, headers=bearer("sk-gw-0123456789ab-wrong")
    )
    assert_openai_error(wrong, 401)
    # A valid key's large body is read (and judged: here it does not fit the context).
    judged = await http.post("/v1/chat/completions", json=big)
    assert_openai_error(judged, 400, code="context_length_exceeded")
    assert fake.calls == []


@pytest.mark.parametrize(
    "headers",
    [
        [(b"content-length", b"5"), (b"transfer-encoding", b"chunked")],
        [(b"transfer-encoding", b"chunked"), (b"content-length", b"5")],
        [(b"content-length", b"5"), (b"content-length", b"5000000")],
    ],
    ids=["length-then-chunked", "chunked-then-length", "two-lengths"],
)
async def test_a_small_declared_length_beside_chunks_does_not_let_a_body_in_unchecked(
    app: FastAPI, headers: list[tuple[bytes, bytes]]
) -> None:
    # A server that frames the body by its chunks (h11 does) would otherwise deliver
    # megabytes under a declared 5 bytes, read and parsed before the key is checked.
    request = httpx.Request(
        "POST",
        f"{BASE_URL}/v1/chat/completions",
        headers=[(b"content-type", b"application/json"), *headers],
    )
    scope = asgi_scope(request)
    read = 0

    async def receive() -> dict[str, object]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": b" " * 1_000_000, "more_body": read < 40}

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 401  # not parsed (it is not JSON), and no key: refused
    # Read and dropped up to the largest body nginx passes on (so nginx, were it sending it,
    # sees no reset), never past it; a body declared past every limit is not read at all.
    assert (read - 1) * 1_000_000 <= 36 * 1024 * 1024  # the last piece read passed the cap
    if (b"content-length", b"5000000") in headers:
        assert read == 0


async def test_decoded_audio_too_long_has_one_code_everywhere(fake: FakeBackend) -> None:
    settings = make_settings(models=VOICE_MODELS, max_audio_seconds=2)
    async with serve(settings, fake) as (_, http, _sdk):
        files = {"file": ("long.wav", tone_file(3), "audio/wav")}
        refused = await http.post(
            "/v1/audio/transcriptions", data={"model": "fake-stt"}, files=files
        )
        assert_openai_error(refused, 400, param="file", code="audio_too_long")
        part = await http.post(
            "/v1/chat/completions",
            json=chat_body(messages=[{"role": "user", "content": [audio_part(3)]}]),
        )
        param = "messages.[0].content.[0].input_audio"
        assert_openai_error(part, 400, param=param, code="audio_too_long")
    assert fake.transcribe_calls == []


async def test_audio_parts_are_bounded_in_seconds_all_together(fake: FakeBackend) -> None:
    settings = make_settings(models=VOICE_MODELS, max_audio_seconds=2)
    async with serve(settings, fake) as (_, http, _sdk):
        # Each part is within the bound; the two of them are not.
        two = [{"role": "user", "content": [audio_part(1.5)]}] * 2
        refused = await http.post("/v1/chat/completions", json=chat_body(messages=two))
        param = "messages.[1].content.[0].input_audio"
        error = assert_openai_error(refused, 400, param=param, code="audio_too_long")
        assert "GATEWAY_MAX_AUDIO_SECONDS" in error["message"]
        assert fake.transcribe_calls == []  # refused before anything was transcribed
        one = await http.post("/v1/chat/completions", json=chat_body(messages=two[:1]))
        assert one.status_code == 200, one.text
    assert len(fake.transcribe_calls) == 1


async def test_audio_parts_are_bounded_in_number(fake: FakeBackend) -> None:
    async with serve(make_settings(models=VOICE_MODELS), fake) as (_, http, _sdk):
        parts = [audio_part(0.05)] * (MAX_AUDIO_PARTS + 1)
        refused = await http.post(
            "/v1/chat/completions", json=chat_body(messages=[{"role": "user", "content": parts}])
        )
        error = assert_openai_error(refused, 400, param="messages", code="too_many_audio_parts")
        assert f"at most {MAX_AUDIO_PARTS}" in error["message"]
    assert fake.transcribe_calls == []


async def test_audio_parts_are_transcribed_at_most_the_requests_share_at_a_time() -> None:
    backend = SlowTranscription(delay_s=0.02)
    settings = make_settings(models=VOICE_MODELS, max_inflight_per_request=2)
    async with serve(settings, backend) as (_, http, _sdk):
        parts = [audio_part(0.2)] * 5
        body = chat_body(messages=[{"role": "user", "content": parts}])
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
    assert len(backend.transcribe_calls) == 5  # every part was transcribed ...
    assert backend.most == 2  # ... never more than two at a time


async def test_a_spoken_answer_the_key_may_not_have_costs_no_transcription(
    fake: FakeBackend,
) -> None:
    async with serve(make_settings(models=VOICE_MODELS), fake) as (_, admin, _sdk):
        key = (await new_key(admin, models=["fake-chat", "fake-stt"]))["key"]
        body = chat_body(
            messages=[{"role": "user", "content": [audio_part(0.5)]}],
            modalities=["text", "audio"],
            audio={"voice": "alloy"},
        )
        refused = await admin.post("/v1/chat/completions", json=body, headers=bearer(key))
        error = assert_openai_error(refused, 403, code="model_not_allowed")
        assert "'fake-tts'" in error["message"]
    assert fake.transcribe_calls == [] and fake.calls == []


async def test_a_client_that_leaves_stops_the_transcription_of_its_audio_parts() -> None:
    backend = SlowTranscription()
    async with serve(make_settings(models=VOICE_MODELS), backend) as (app, _, _sdk):
        body = chat_body(messages=[{"role": "user", "content": [audio_part(0.5)]}])
        request = httpx.Request("POST", f"{BASE_URL}/v1/chat/completions", json=body, headers=AUTH)
        started = time.monotonic()
        status = await leave_once(app, request, backend.started)
    assert status == 499
    assert backend.cancelled == 1 and time.monotonic() - started < backend.delay_s
    assert backend.calls == []  # and the chat model never heard of it
