"""A tool call's ``arguments`` nested 5,000 deep in the history, sent as an attacker would
(the official SDK, through nginx to the shared stack): a 400 naming the limit on chat and
Responses, where it was a 500 with a RecursionError traceback, and the same conversation at
an ordinary depth still answered."""

from __future__ import annotations

from typing import Any

import openai
import pytest

pytestmark = pytest.mark.integration

DEEP = '{"city": ' + "[" * 5000 + "]" * 5000 + "}"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def history(arguments: str) -> list[Any]:
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": arguments}  # type: ignore[assignment]
    return [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]


def test_deep_arguments_in_a_chat_history_are_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="mock_chat", messages=history(DEEP), tools=[WEATHER], max_tokens=4
        )
    body: Any = refused.value.body
    assert refused.value.code == "json_too_deep"
    assert body["param"] == "messages.[1].tool_calls.[0].function.arguments"
    assert "at most 128 levels" in body["message"]
    reply = client.chat.completions.create(
        model="mock_chat", messages=history('{"city": "Oslo"}'), tools=[WEATHER], max_tokens=4
    )
    assert reply.choices[0].message.content


def test_deep_arguments_in_responses_input_are_a_400(client: openai.OpenAI) -> None:
    items: Any = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": DEEP},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="mock_chat", input=items, max_output_tokens=16)
    assert refused.value.code == "json_too_deep"
    body: Any = refused.value.body
    assert body["param"] == "input"
