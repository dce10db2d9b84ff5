"""Tool calls' ``arguments`` in the history are JSON the gateway parses (the chat template
gets them as objects): nested past ``GATEWAY_MAX_JSON_DEPTH`` they are a 400 naming the
limit, on chat (tools and legacy functions) and Responses, never a 500 from a parser that
recursed until it failed; a model's own deep output stays text."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.backend.fake import FakeBackend
from gateway.serving.tools import for_template
from tests.support.bodies import assert_openai_error
from tests.support.shapes import WEATHER

CHAT = "/v1/chat/completions"
#: Arguments nested 5,000 deep: what made the parser raise RecursionError (a 500).
DEEP = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"


def nested(levels: int) -> str:
    """An arguments object nested ``levels`` deep in all."""
    return '{"a": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"


def history(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": arguments}  # type: ignore[assignment]
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]


async def test_deep_arguments_in_the_history_are_a_400_naming_the_limit(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="fake-chat",
            messages=history(DEEP),  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert refused.value.code == "json_too_deep"
    assert error["param"] == "messages.[1].tool_calls.[0].function.arguments"
    assert "5001 levels" in error["message"] and "at most 128" in error["message"]
    assert "GATEWAY_MAX_JSON_DEPTH" in error["message"]
    assert fake.calls == []


async def test_arguments_at_the_limit_reach_the_template_as_an_object(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    body = {"model": "fake-chat", "messages": history(nested(128)), "tools": [WEATHER]}
    response = await http.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    body["messages"] = history(nested(129))
    assert_openai_error(await http.post(CHAT, json=body), 400, code="json_too_deep")


async def test_the_bound_is_the_setting(fake: FakeBackend) -> None:
    from tests.support.inprocess import make_settings, serve

    async with serve(make_settings(max_json_depth=8), fake) as (_, http, _sdk):
        body = {"model": "fake-chat", "messages": history(nested(9)), "tools": [WEATHER]}
        error = assert_openai_error(await http.post(CHAT, json=body), 400, code="json_too_deep")
        assert "at most 8 levels" in error["message"]
        body["messages"] = history(nested(8))
        assert (await http.post(CHAT, json=body)).status_code == 200


async def test_legacy_function_call_arguments_too(http: httpx.AsyncClient) -> None:
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": DEEP}},
        {"role": "function", "name": "f", "content": "sunny"},
    ]
    body = {"model": "fake-chat", "messages": messages, "functions": [WEATHER["function"]]}
    assert_openai_error(
        await http.post(CHAT, json=body),
        400,
        code="json_too_deep",
        param="messages.[1].function_call.arguments",
    )


async def test_responses_function_call_items_too(http: httpx.AsyncClient) -> None:
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": DEEP},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    body = {"model": "fake-chat", "input": items}
    assert_openai_error(
        await http.post("/v1/responses", json=body), 400, code="json_too_deep", param="input"
    )


@pytest.mark.parametrize(
    "written",
    [
        # Read as it streams: the arguments are passed on as the model wrote them.
        f'{{"name": "get_weather", "arguments": {DEEP}}}',
        # The name after the arguments: the block is parsed whole once closed.
        f'{{"arguments": {DEEP}, "name": "get_weather"}}',
    ],
)
async def test_a_models_deep_call_is_answered_not_a_500(
    http: httpx.AsyncClient, fake: FakeBackend, written: str
) -> None:
    fake.reply = f"<tool_call> {written} </tool_call>"
    body = {"model": "fake-chat", "messages": [{"role": "user", "content": "Hi"}]}
    response = await http.post(CHAT, json={**body, "tools": [WEATHER]})
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    assert "[[[[" in (calls[0]["function"]["arguments"] if calls else message["content"])


def test_stored_deep_arguments_reach_a_template_as_text() -> None:
    """A session's stored turn (a model's call, never checked as a request) is kept as the
    text it was, not parsed."""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": DEEP}}
    [shown] = for_template([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert shown["tool_calls"][0]["function"]["arguments"] == DEEP
    call["function"]["arguments"] = nested(3)  # type: ignore[index]
    [shown] = for_template([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert shown["tool_calls"][0]["function"]["arguments"] == json.loads(nested(3))


async def test_arguments_that_would_parse_into_millions_of_objects_are_refused(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # One string value of the body, so the body's own measure passes it; parsed for the
    # template it was 10 million dicts (about a gigabyte) before the refusal.
    many = "[" + ",".join(["{}"] * 3_000_000) + "]"
    body = {"model": "fake-chat", "messages": history(many), "tools": [WEATHER]}
    error = assert_openai_error(await http.post(CHAT, json=body), 400, code="json_too_complex")
    assert "GATEWAY_MAX_JSON_CONTAINERS" in error["message"]
    # The bound is on all the calls' arguments together, not on each.
    some = "[" + ",".join(["{}"] * 20_000) + "]"
    two = history(some) + history(some)[1:]
    two[3]["tool_calls"][0]["id"] = "call_2"
    two[4]["tool_call_id"] = "call_2"
    refused = await http.post(
        CHAT, json={"model": "fake-chat", "messages": two, "tools": [WEATHER]}
    )
    assert_openai_error(refused, 400, code="json_too_complex")
    assert fake.calls == []
