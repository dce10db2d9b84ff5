"""Tool calling, structured outputs, n, logprobs and legacy completions end to end: the
official openai client -> nginx -> gateway -> real Triton (smollm2 constrained by llama.cpp
grammars, mock_chat writing values that fit)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pydantic
import pytest

from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int


def test_parse_with_a_pydantic_model_on_smollm2(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Describe Paris as JSON."}]
    reply = client.chat.completions.parse(
        model="smollm2", messages=messages, response_format=City, temperature=0, max_tokens=80
    )
    assert isinstance(reply.choices[0].message.parsed, City)
    with client.chat.completions.stream(
        model="smollm2", messages=messages, response_format=City, temperature=0, max_tokens=80
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == reply.choices[0].message.parsed


def test_json_object_is_valid_json(client: openai.OpenAI) -> None:
    # smollm2 keeps nesting objects until max_tokens with json_object; mock_chat finishes.
    reply = client.chat.completions.create(
        model="mock_chat",
        messages=[{"role": "user", "content": "List three colours as JSON."}],
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_calls_always_parse_even_from_a_135m_model(
    client: openai.OpenAI, choice: object
) -> None:
    reply = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=[WEATHER], tool_choice=choice, temperature=0
    )
    # A call the request named ends with "stop", as OpenAI answers; one it required with
    # "tool_calls".
    assert reply.choices[0].finish_reason == ("tool_calls" if choice == "required" else "stop")
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_streamed_tool_call_and_the_round_trip(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0
    ) as stream:
        pieces = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        first = stream.get_final_completion()
    assert len(pieces) > 1
    call = first.choices[0].message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    messages = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 C and sunny"},
    ]
    final = client.chat.completions.create(
        model="smollm2", messages=messages, tools=[WEATHER], temperature=0, max_tokens=40
    )
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.choices[0].message.content or final.choices[0].message.tool_calls
    assert arguments["city"]


def test_tool_call_with_auto_comes_back_parsed_from_the_model_text(client: openai.OpenAI) -> None:
    # mock_chat writes the text it is told to, as a model trained for tools would.
    said = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    directive = "[mock:say=" + said.replace(" ", "%20") + "]"
    reply = client.chat.completions.create(
        model="mock_chat", messages=[{"role": "user", "content": directive}], tools=[WEATHER]
    )
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Oslo"},
    )


def test_completions_n_and_logprobs(client: openai.OpenAI) -> None:
    done = client.completions.create(model="mock_chat", prompt="Once upon", max_tokens=4, n=2)
    assert [c.index for c in done.choices] == [0, 1]
    assert all(c.text == "The quick brown fox" for c in done.choices)
    assert done.usage.completion_tokens == 8
    streamed = client.completions.create(
        model="mock_chat", prompt="Once upon", max_tokens=4, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == "The quick brown fox"
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    tokens = reply.choices[0].logprobs.content
    assert "".join(t.token for t in tokens) == reply.choices[0].message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 for t in tokens)
    # Greedy decoding picks the likeliest token.
    assert all(t.top_logprobs[0].token == t.token for t in tokens)


def test_models_show_capabilities_and_bad_input_is_400(
    client: openai.OpenAI, stack: GatewayProcess
) -> None:
    models = {m.id: m.model_extra for m in client.models.list()}
    assert models["smollm2"]["capabilities"]["tool_calling"] is True
    assert models["smollm2"]["capabilities"]["structured_outputs"] == ["json_object", "json_schema"]
    # 1.5 MB: at least 46,875 tokens (32 bytes a token at most), past 32,768.
    huge = [{"role": "user", "content": "word " * 300_000}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="mock_chat", messages=huge)
    assert refused.value.body["param"] == "messages"
    assert refused.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="mock_chat",
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert bad.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as unknown_call:
        client.chat.completions.create(
            model="mock_chat",
            messages=[*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "1"}],
        )
    assert unknown_call.value.body["param"] == "messages.[1].tool_call_id"
