"""Streaming chat completions: the OpenAI chunk format, SSE framing, errors, cancellation."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from gateway.backend.fake import FakeBackend
from tests.support.bodies import USER_HI, chat_body, sse_events, sse_json
from tests.support.inprocess import REPLY, make_settings, serve


async def test_sdk_stream_chunks(client: openai.AsyncOpenAI, fake: FakeBackend) -> None:
    stream = await client.chat.completions.create(model="fake-chat", messages=USER_HI, stream=True)
    chunks = [chunk async for chunk in stream]

    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {chunks[0].id}
    assert chunks[0].id.startswith("chatcmpl-")
    assert {c.created for c in chunks} == {chunks[0].created}
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert {c.model for c in chunks} == {"fake-chat"}
    assert all(len(c.choices) == 1 for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == REPLY
    # One content chunk per token, then the finish.
    assert sum(1 for c in chunks if c.choices[0].delta.content) == len(REPLY.split())
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None for c in chunks)
    assert fake.calls[-1].stream is True


async def test_sdk_stream_with_usage(client: openai.AsyncOpenAI, fake: FakeBackend) -> None:
    stream = await client.chat.completions.create(
        model="fake-chat",
        messages=USER_HI,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]

    usage_chunks = [c for c in chunks if not c.choices]
    assert len(usage_chunks) == 1
    assert chunks[-1] is usage_chunks[0]  # after the finish chunk
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == len(REPLY.split())
    assert usage.prompt_tokens == len(fake.calls[-1].prompt.split()) > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert chunks[-1].id == chunks[0].id
    assert chunks[-1].created == chunks[0].created

    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "stop"


async def test_stream_honours_max_tokens(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, stream=True, max_tokens=2
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello from"
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_raw_sse_framing_and_headers(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/v1/chat/completions",
        json=chat_body(stream=True, stream_options={"include_usage": True}),
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    assert response.text.endswith("data: [DONE]\n\n")

    events = sse_json(response.text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # With include_usage every chunk carries "usage": null, the last one the numbers.
    assert all("usage" in e and e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == []
    assert set(events[-1]["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    for event in events[:-1]:
        choice = event["choices"][0]
        assert choice["index"] == 0
        assert "logprobs" in choice and choice["logprobs"] is None


async def test_a_streamed_spoken_answer_carries_usage_null_like_every_chat_chunk() -> None:
    settings = make_settings(models=["fake-chat", "fake-tts", "fake-stt"])
    async with serve(settings) as (_, http, _sdk):
        response = await http.post(
            "/v1/chat/completions",
            json=chat_body(
                stream=True,
                modalities=["text", "audio"],
                audio={"voice": "alloy", "format": "pcm16"},
                stream_options={"include_usage": True},
            ),
        )
    assert response.status_code == 200, response.text
    events = sse_json(response.text)
    assert all("usage" in e and e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] > 0
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert "".join(d.get("audio", {}).get("transcript", "") for d in deltas) == REPLY
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_raw_sse_without_usage_has_no_usage_chunk(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/chat/completions", json=chat_body(stream=True))
    events = sse_json(response.text)
    assert all(len(e["choices"]) == 1 for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"][0]["delta"] == {}


async def test_text_needing_json_escapes_survives_the_stream(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = 'Say "hi"\nnow \\ ünïcødé 🚀 </script>'
    stream = await client.chat.completions.create(model="fake-chat", messages=USER_HI, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == fake.reply


async def test_failure_before_the_first_token_is_a_real_http_error(
    http: httpx.AsyncClient, client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.fail_after_tokens = 0
    response = await http.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 500
    assert not response.headers["content-type"].startswith("text/event-stream")
    error = response.json()["error"]
    assert error["code"] == "model_error"
    assert "injected failure" in error["message"]

    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="fake-chat", messages=USER_HI, stream=True)


async def test_failure_mid_stream_is_an_sse_error_event_then_done(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.fail_after_tokens = 2
    response = await http.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200

    events = sse_json(response.text)
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert content == "Hello from"
    error = events[-1]["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "model_error"
    assert "injected failure" in error["message"]
    # No chunk claims the generation finished normally.
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])


async def test_sdk_raises_on_a_mid_stream_failure_and_the_app_keeps_serving(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.fail_after_tokens = 2
    stream = await client.chat.completions.create(model="fake-chat", messages=USER_HI, stream=True)
    received = []
    with pytest.raises(openai.APIError, match="injected failure"):
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "Hello from"

    fake.fail_after_tokens = None
    completion = await client.chat.completions.create(model="fake-chat", messages=USER_HI)
    assert completion.choices[0].message.content == REPLY
    stream = await client.chat.completions.create(model="fake-chat", messages=USER_HI, stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in stream]) == REPLY


async def test_unexpected_error_mid_stream_is_a_generic_error_event(
    http: httpx.AsyncClient, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(index: int) -> None:
        if index >= 1:
            raise RuntimeError("secret internal detail")

    monkeypatch.setattr(fake, "_maybe_fail", explode)
    response = await http.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error"
    assert "secret internal detail" not in error["message"]


async def test_first_chunk_arrives_before_the_generation_ends(
    stream_http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = " ".join(f"w{i}" for i in range(20))
    fake.token_delay_s = 0.01
    async with stream_http.stream(
        "POST", "/v1/chat/completions", json=chat_body(stream=True)
    ) as response:
        assert response.status_code == 200
        first_content = None
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"content":"w' in line:
                first_content = json.loads(line.removeprefix("data: "))
                break
    assert first_content is not None
    assert first_content["choices"][0]["delta"]["content"] == "w0"


async def test_client_going_away_cancels_the_generation(
    stream_http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = " ".join(f"w{i}" for i in range(50))
    fake.token_delay_s = 0.01
    async with stream_http.stream(
        "POST", "/v1/chat/completions", json=chat_body(stream=True)
    ) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if '"content":"w' in line:
                break  # leaving the block closes the response: the client went away
    call = fake.calls[-1]
    assert call.cancelled is True
    assert 0 < call.tokens_sent < 50
    # It stays stopped: no tokens are produced after the client left.
    sent = call.tokens_sent
    await asyncio.sleep(0.05)
    assert call.tokens_sent == sent


async def test_a_finished_stream_is_not_reported_as_cancelled(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    response = await http.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    assert fake.calls[-1].cancelled is False
    assert fake.calls[-1].tokens_sent == len(REPLY.split())
