"""Draining before a stop (SIGTERM): requests in flight go on to their end, new ones get a
503 that clients retry, probes say "not ready" but "alive"."""

from __future__ import annotations

import json

import httpx
from fastapi import FastAPI

from gateway.backend.fake import FakeBackend
from tests.support.bodies import assert_openai_error, chat_body


async def test_a_draining_gateway_finishes_streams_and_refuses_new_requests(
    app: FastAPI, stream_http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = " ".join(f"w{i}" for i in range(30))
    fake.token_delay_s = 0.005
    drain = app.state.drain
    words = []
    async with stream_http.stream(
        "POST", "/v1/chat/completions", json=chat_body(stream=True)
    ) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        async for line in lines:
            if '"content":"w' in line:
                words.append(json.loads(line.removeprefix("data: ")))
                break
        assert drain.busy == 1
        drain.draining = True  # what SIGTERM does (gateway.stack.server._DrainingServer)

        refused = await stream_http.post("/v1/chat/completions", json=chat_body())
        error = assert_openai_error(refused, 503, code="shutting_down", type="server_error")
        assert "shutting down" in error["message"]
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["connection"] == "close"
        assert_openai_error(await stream_http.get("/health/ready"), 503, code="shutting_down")
        assert (await stream_http.get("/health/live")).status_code == 200
        assert (await stream_http.get("/metrics")).status_code == 200

        done = False
        async for line in lines:
            if line.startswith("data: {"):
                words.append(json.loads(line.removeprefix("data: ")))
            done = done or line == "data: [DONE]"
    text = "".join(w["choices"][0]["delta"].get("content") or "" for w in words if w["choices"])
    assert text == fake.reply and done  # the stream in flight ran to its end
    assert drain.busy == 0
    assert fake.calls[-1].cancelled is False


async def test_a_draining_gateway_refuses_an_anthropic_client_in_its_shape(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    app.state.drain.draining = True
    body = {"model": "fake-chat", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    refused = await http.post("/v1/messages", json=body)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert int(refused.headers["content-length"]) == len(refused.content)
    assert refused.json()["error"]["type"] == "overloaded_error"
    assert refused.json()["request_id"]  # the same id the handlers give
