"""Every failure of /v1/chat/completions is an OpenAI error body with the right status."""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.backend.fake import FakeBackend
from tests.support.bodies import USER_HI, assert_openai_error, chat_body
from tests.support.inprocess import AUTH, BASE_URL, REPLY, make_settings

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("model", ["no-such-model", "fake-unloaded"])
async def test_unknown_or_unloaded_model_is_404(
    http: httpx.AsyncClient, client: openai.AsyncOpenAI, fake: FakeBackend, model: str
) -> None:
    error = assert_openai_error(
        await http.post(CHAT, json=chat_body(model=model)),
        404,
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )
    assert model in error["message"]
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model=model, messages=USER_HI)
    assert fake.calls == []


async def test_model_of_another_task_is_400(
    http: httpx.AsyncClient, client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    error = assert_openai_error(
        await http.post(CHAT, json=chat_body(model="fake-tts")),
        400,
        type="invalid_request_error",
        param="model",
        code="model_not_supported",
    )
    assert "fake-tts" in error["message"]
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="fake-tts", messages=USER_HI)
    assert raised.value.code == "model_not_supported"
    assert fake.calls == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"stop": ""}, "stop"),
        ({"messages": []}, "messages"),
        ({"model": ""}, "model"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.[0].role"),
        ({"messages": [{"content": "x"}]}, "messages.[0].role"),
    ],
)
async def test_validation_errors_are_400_naming_the_param(
    http: httpx.AsyncClient, fake: FakeBackend, fields: dict[str, Any], param: str
) -> None:
    error = assert_openai_error(
        await http.post(CHAT, json=chat_body(**fields)),
        400,
        type="invalid_request_error",
        param=param,
    )
    assert param in error["message"]
    assert fake.calls == []


async def test_missing_required_fields_are_400(http: httpx.AsyncClient) -> None:
    error = assert_openai_error(await http.post(CHAT, json={}), 400)
    assert error["param"] in ("model", "messages")
    assert "1 more invalid parameter" in error["message"]  # both missing fields count


async def test_sdk_sees_validation_errors_as_bad_request(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model="fake-chat", messages=USER_HI, temperature=3)
    assert raised.value.status_code == 400
    assert raised.value.param == "temperature"


async def test_malformed_json_body_is_400(http: httpx.AsyncClient) -> None:
    response = await http.post(
        CHAT,
        content=b'{"model": "fake-chat", "messages": [',
        headers={"content-type": "application/json"},
    )
    error = assert_openai_error(response, 400, type="invalid_request_error", param=None)
    assert "JSON" in error["message"]


async def test_body_that_is_not_an_object_is_400(http: httpx.AsyncClient) -> None:
    assert_openai_error(await http.post(CHAT, json=["not", "an", "object"]), 400)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        # fake-plain is a chat model whose config names no capabilities.
        ({"model": "fake-plain", "logprobs": True}, "logprobs"),
        ({"model": "fake-chat", "logprobs": True, "top_logprobs": 6}, "top_logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        (
            {
                "model": "fake-plain",
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            },
            "tools",
        ),
        (
            {
                "model": "fake-plain",
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": "required",
            },
            "tool_choice",
        ),
        ({"model": "fake-plain", "response_format": {"type": "json_object"}}, "response_format"),
        (
            {
                "model": "fake-plain",
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}},
                },
            },
            "response_format",
        ),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
async def test_unsupported_features_are_400_with_a_clear_message(
    http: httpx.AsyncClient, fake: FakeBackend, fields: dict[str, Any], param: str
) -> None:
    error = assert_openai_error(
        await http.post(CHAT, json=chat_body(**fields)),
        400,
        type="invalid_request_error",
        param=param,
        code="unsupported_parameter",
    )
    message = error["message"]
    assert any(w in message for w in ("support", "allowed", "cannot", "not", "needs", "at most"))
    assert fake.calls == []


async def test_image_content_part_is_400(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}]
    error = assert_openai_error(
        await http.post(CHAT, json=chat_body(messages=messages)),
        400,
        type="invalid_request_error",
        param="messages.[0].content.[1]",
        code="image_not_supported",
    )
    assert "does not see images" in error["message"]
    assert fake.calls == []


async def test_tool_message_answering_no_call_is_400(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    messages = [*USER_HI, {"role": "tool", "content": "42", "tool_call_id": "call_1"}]
    error = assert_openai_error(
        await http.post(CHAT, json=chat_body(messages=messages)),
        400,
        type="invalid_request_error",
        param="messages.[1].tool_call_id",
    )
    assert "call_1" in error["message"]
    assert fake.calls == []


async def test_assistant_message_without_content_is_400(http: httpx.AsyncClient) -> None:
    messages = [*USER_HI, {"role": "assistant", "content": None, "tool_calls": []}]
    assert_openai_error(
        await http.post(CHAT, json=chat_body(messages=messages)),
        400,
        param="messages.[1].content",
    )


async def test_text_part_without_text_gets_a_message_that_makes_sense(
    http: httpx.AsyncClient,
) -> None:
    messages = [{"role": "user", "content": [{"type": "text"}]}]
    error = assert_openai_error(
        await http.post(CHAT, json=chat_body(messages=messages)),
        400,
        param="messages.[0].content",
    )
    assert "type 'text' are not supported" not in error["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": [{"role": "user", "content": 123}]}, "messages.[0].content"),
    ],
)
async def test_union_field_errors_name_the_field(
    http: httpx.AsyncClient, fields: dict[str, Any], param: str
) -> None:
    assert_openai_error(await http.post(CHAT, json=chat_body(**fields)), 400, param=param)


async def test_backend_down_is_503(
    http: httpx.AsyncClient, client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.up = False
    for body in (chat_body(), chat_body(stream=True)):
        assert_openai_error(
            await http.post(CHAT, json=body), 503, type="server_error", code="backend_unavailable"
        )
    assert_openai_error(await http.get("/health/ready"), 503)
    with pytest.raises(openai.InternalServerError) as raised:
        await client.chat.completions.create(model="fake-chat", messages=USER_HI)
    assert raised.value.status_code == 503


async def test_errors_name_their_request_id_which_the_log_has_too(
    http: httpx.AsyncClient, fake: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    fake.up = False
    with caplog.at_level(logging.WARNING, logger="gateway"):
        given = await http.post(CHAT, json=chat_body(), headers={"X-Request-ID": "req-42.a"})
        # No id, or one nginx would not take either: a new one.
        made = await http.post(CHAT, json=chat_body(), headers={"X-Request-ID": "x" * 129})
    error = assert_openai_error(given, 503, code="backend_unavailable")
    assert given.headers["x-request-id"] == "req-42.a"
    assert "req-42.a" in error["message"]
    new_id = made.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", new_id)
    assert new_id in made.json()["error"]["message"]
    logged = [r.getMessage() for r in caplog.records]
    assert any("req-42.a" in line for line in logged)
    assert any(new_id in line for line in logged)
    # A client error carries the id in its header; its message is about the request only.
    refused = await http.post(CHAT, json=chat_body(temperature=3))
    assert refused.headers["x-request-id"]
    assert "request id" not in refused.json()["error"]["message"]


async def test_backend_going_down_after_the_catalog_was_read_is_503(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    assert (await http.post(CHAT, json=chat_body())).status_code == 200
    fake.up = False  # the model is still in the gateway's cached catalog
    assert_openai_error(await http.post(CHAT, json=chat_body()), 503, code="backend_unavailable")
    fake.up = True
    assert (await http.post(CHAT, json=chat_body())).status_code == 200


async def test_model_failure_without_streaming_is_500(
    http: httpx.AsyncClient, client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.fail_after_tokens = 0
    error = assert_openai_error(
        await http.post(CHAT, json=chat_body()), 500, type="server_error", code="model_error"
    )
    assert "request id" in error["message"]
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="fake-chat", messages=USER_HI)

    fake.fail_after_tokens = None
    completion = await client.chat.completions.create(model="fake-chat", messages=USER_HI)
    assert completion.choices[0].message.content == REPLY


async def test_unexpected_exception_is_a_500_without_internals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeBackend()

    def explode(index: int) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(fake, "_maybe_fail", explode)
    app = create_app(make_settings(), backend=fake)
    # The app re-raises unexpected errors to the server after answering; a real server logs
    # them, so do not let the test transport raise them.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=AUTH) as http,
    ):
        error = assert_openai_error(
            await http.post(CHAT, json=chat_body()), 500, type="server_error"
        )
    assert "secret internal detail" not in error["message"]


async def test_unknown_route_and_wrong_method_get_openai_errors(http: httpx.AsyncClient) -> None:
    assert_openai_error(
        await http.get("/v1/nothing-here"), 404, type="not_found_error", code="not_found"
    )
    assert_openai_error(
        await http.put(CHAT), 405, type="invalid_request_error", code="method_not_allowed"
    )


async def test_max_tokens_beyond_the_context_is_400_before_any_generation(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # fake-chat has a 2048-token context.
    response = await http.post(CHAT, json=chat_body(max_completion_tokens=4096))
    error = assert_openai_error(response, 400, param="max_completion_tokens")
    assert error["code"] == "context_length_exceeded"
    assert fake.calls == []
