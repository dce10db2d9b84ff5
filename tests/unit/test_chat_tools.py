"""Tools, structured outputs, n and logprobs on chat, and legacy completions, through the
official SDK against the fake backend (which answers ``fake.reply`` word by word)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import httpx
import openai
import pytest

from gateway.backend.fake import FakeBackend
from tests.support.bodies import USER_HI, assert_openai_error, chat_body, sse_json
from tests.support.shapes import CALL, WEATHER, City


async def test_auto_tool_call_is_parsed_into_tool_calls(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = CALL
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, tools=[WEATHER]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The chat template got the tools, and no constraint was sent.
    assert '"name": "get_weather"' in fake.calls[-1].prompt
    assert fake.calls[-1].options.constraint is None


async def test_streamed_tool_calls_assemble_in_the_sdk(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = CALL
    async with client.chat.completions.stream(
        model="fake-chat", messages=USER_HI, tools=[WEATHER]
    ) as stream:
        deltas = [e async for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = await stream.get_final_completion()
    assert len(deltas) > 1, "arguments should arrive in pieces"
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls"


async def test_required_and_named_tool_choice_send_a_constraint(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, tools=[WEATHER], tool_choice="required"
    )
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    schema = fake.calls[-1].options.constraint["json"]
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert schema["items"]["properties"]["name"]["enum"] == ["get_weather"]

    fake.reply = '{"city": "Rome"}'
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, tools=[WEATHER], tool_choice=named
    )
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Rome"},
    )
    assert fake.calls[-1].options.constraint == {"json": WEATHER["function"]["parameters"]}


async def test_tool_round_trip_renders_the_call_and_its_result(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = CALL
    first = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, tools=[WEATHER]
    )
    call = first.choices[0].message.tool_calls[0]
    fake.reply = "It is sunny in Paris."
    messages = [
        *USER_HI,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 C, sunny"},
    ]
    final = await client.chat.completions.create(
        model="fake-chat", messages=messages, tools=[WEATHER]
    )
    assert final.choices[0].message.content == "It is sunny in Paris."
    prompt = fake.calls[-1].prompt
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "22 C, sunny" in prompt


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        (
            {"tools": [{"type": "function", "function": {"description": "x"}}]},
            "tools.[0].function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools.[0].function.parameters",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"n": 2, "stream": False, "messages": [{"role": "user", "content": "x" * 70_000}]},
            "messages",
        ),
    ],
)
async def test_bad_tool_and_format_input_is_400_naming_the_parameter(
    http: httpx.AsyncClient, fake: FakeBackend, fields: dict[str, object], param: str
) -> None:
    body = chat_body(**{"tools": [WEATHER], **fields})
    if param == "tool_choice" and fields.get("tool_choice") == "required":
        body.pop("tools")
    assert_openai_error(await http.post("/v1/chat/completions", json=body), 400, param=param)
    assert fake.calls == []


async def test_parse_with_a_pydantic_model_streamed_and_not(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = '{"name": "Paris", "population": 2100000}'
    parsed = await client.chat.completions.parse(
        model="fake-chat", messages=USER_HI, response_format=City
    )
    assert parsed.choices[0].message.parsed == City(name="Paris", population=2100000)
    constraint = fake.calls[-1].options.constraint
    assert constraint["json"]["properties"]["population"]["type"] == "integer"
    async with client.chat.completions.stream(
        model="fake-chat", messages=USER_HI, response_format=City
    ) as stream:
        final = await stream.get_final_completion()
    assert final.choices[0].message.parsed == City(name="Paris", population=2100000)


async def test_n_choices_run_as_separate_requests_with_summed_usage(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, n=3, seed=7, max_tokens=2
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.message.content for c in reply.choices] == ["Hello from"] * 3
    assert [call.options.seed for call in fake.calls] == [7, 8, 9]
    assert reply.usage.completion_tokens == 6
    stream = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, n=2, stream=True, max_tokens=2
    )
    texts = {0: "", 1: ""}
    finishes = {}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: "Hello from", 1: "Hello from"}
    assert finishes == {0: "length", 1: "length"}


async def test_logprobs_streamed_and_not(client: openai.AsyncOpenAI, fake: FakeBackend) -> None:
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, logprobs=True, top_logprobs=2
    )
    content = reply.choices[0].logprobs.content
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 for t in content)
    assert content[0].logprob == pytest.approx(-0.1)
    assert fake.calls[-1].options.logprobs == 2
    stream = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, logprobs=True, stream=True
    )
    tokens = [
        t.token
        async for chunk in stream
        for c in chunk.choices
        if c.logprobs and c.logprobs.content
        for t in c.logprobs.content
    ]
    assert "".join(tokens) == reply.choices[0].message.content


async def test_legacy_completions(client: openai.AsyncOpenAI, fake: FakeBackend) -> None:
    done = await client.completions.create(
        model="fake-chat", prompt=["Say hi", "Say bye"], max_tokens=2, n=2, echo=True
    )
    assert done.object == "text_completion"
    assert [c.index for c in done.choices] == [0, 1, 2, 3]
    assert [c.text for c in done.choices] == ["Say hiHello from"] * 2 + ["Say byeHello from"] * 2
    assert [call.prompt for call in fake.calls] == ["Say hi", "Say hi", "Say bye", "Say bye"]
    stream = await client.completions.create(
        model="fake-chat",
        prompt="Hi",
        stream=True,
        logprobs=1,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == "Hello from the fake backend."[: len(text)] and text
    assert chunks[-1].usage.completion_tokens == 5
    offsets = [
        o
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for o in c.choices[0].logprobs.text_offset
    ]
    assert offsets == sorted(offsets) and offsets[0] == 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"logprobs": 2, "model": "fake-plain"}, "logprobs"),
        ({"prompt": "x" * 70_000}, "prompt"),
    ],
)
async def test_completions_refuse_what_they_cannot_do(
    http: httpx.AsyncClient, fields: dict[str, object], param: str
) -> None:
    body = {"model": "fake-chat", "prompt": "Hi", **fields}
    assert_openai_error(await http.post("/v1/completions", json=body), 400, param=param)


async def test_models_show_their_capabilities(http: httpx.AsyncClient) -> None:
    models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
    assert models["fake-chat"]["capabilities"] == {
        "tool_calling": True,
        "forced_tool_calls": True,
        "structured_outputs": ["json_object", "json_schema"],
        "logprobs": True,
        "max_logprobs": 5,
        "reasoning": None,
        "images": False,
        "max_images": None,
    }
    assert models["fake-plain"]["capabilities"]["tool_calling"] is False
    assert models["fake-tts"]["capabilities"] is None


TWO_CALLS = (
    CALL + ' <tool_call> {"name": "get_weather", "arguments": {"city": "Oslo"}} </tool_call>'
)
STRICT_WEATHER = {"type": "function", "function": {**WEATHER["function"], "strict": True}}


async def test_no_parallel_calls_keeps_only_the_first_call(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = TWO_CALLS + " and some words after"
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, tools=[WEATHER], parallel_tool_calls=False
    )
    calls = reply.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.content is None


async def test_no_parallel_calls_ends_the_stream_and_the_generation_at_the_first_call(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = TWO_CALLS + " and some words after"
    async with client.chat.completions.stream(
        model="fake-chat", messages=USER_HI, tools=[WEATHER], parallel_tool_calls=False
    ) as stream:
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}]
    assert final.choices[0].finish_reason == "tool_calls"
    # The model was stopped once its first call was read, not left to write the second.
    assert fake.calls[-1].cancelled
    assert fake.calls[-1].tokens_sent < len(fake.reply.split(" "))


async def test_strict_arguments_that_match_cost_no_second_generation(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = CALL
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, tools=[STRICT_WEATHER]
    )
    assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments) == {
        "city": "Paris"
    }
    assert len(fake.calls) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_strict_arguments_that_break_the_schema_are_generated_again_under_it(
    client: openai.AsyncOpenAI, fake: FakeBackend, stream: bool
) -> None:
    bad = '<tool_call> {"name": "get_weather", "arguments": {"town": 5}} </tool_call>'
    fake.replies = [bad, '{"city": "Lyon"}']
    if stream:
        async with client.chat.completions.stream(
            model="fake-chat",
            messages=USER_HI,
            tools=[STRICT_WEATHER],
            stream_options={"include_usage": True},
        ) as events:
            sent = [
                e.arguments_delta
                async for e in events
                if e.type == "tool_calls.function.arguments.delta" and e.arguments_delta
            ]
            reply = await events.get_final_completion()
        # Held back until checked: only the arguments that match are ever sent.
        assert sent == ['{"city": "Lyon"}']
    else:
        reply = await client.chat.completions.create(
            model="fake-chat", messages=USER_HI, tools=[STRICT_WEATHER]
        )
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Lyon"},
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    first, again = fake.calls
    # The second generation continues the first from where its arguments began, under the
    # function's schema.
    assert again.prompt == first.prompt + '<tool_call> {"name": "get_weather", "arguments":'
    assert again.options.constraint == {"json": WEATHER["function"]["parameters"]}
    assert reply.usage.completion_tokens == len(bad.split(" ")) + 2


async def test_strict_tools_need_a_model_that_enforces_schemas(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.model_list[0] = replace(fake.model_list[0], structured_outputs=())
    response = await http.post("/v1/chat/completions", json=chat_body(tools=[STRICT_WEATHER]))
    assert_openai_error(
        response, 400, param="tools.[0].function.strict", code="unsupported_parameter"
    )
    assert not fake.calls


FUNCTION = WEATHER["function"]


async def test_legacy_functions_answer_in_their_own_shape(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = TWO_CALLS
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, functions=[FUNCTION]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.tool_calls is None
    assert choice.message.function_call.name == "get_weather"
    assert json.loads(choice.message.function_call.arguments) == {"city": "Paris"}
    # Shown to the model as a tool, read by its parser.
    assert '"name": "get_weather"' in fake.calls[-1].prompt


async def test_legacy_functions_stream_function_call_deltas(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = CALL
    response = await http.post(
        "/v1/chat/completions", json=chat_body(functions=[FUNCTION], stream=True)
    )
    chunks = [c["choices"][0] for c in sse_json(response.text)]
    calls = [c["delta"]["function_call"] for c in chunks if "function_call" in c["delta"]]
    assert calls[0]["name"] == "get_weather"
    assert "name" not in calls[1]
    assert json.loads("".join(c["arguments"] for c in calls)) == {"city": "Paris"}
    assert not any("tool_calls" in c["delta"] for c in chunks)
    assert chunks[-1]["finish_reason"] == "function_call"


async def test_legacy_function_call_names_or_hides_the_function(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = '{"city": "Rome"}'
    reply = await client.chat.completions.create(
        model="fake-chat",
        messages=USER_HI,
        functions=[FUNCTION],
        function_call={"name": "get_weather"},
    )
    assert reply.choices[0].message.function_call.name == "get_weather"
    assert reply.choices[0].finish_reason == "stop"  # a call the request named, as OpenAI
    assert fake.calls[-1].options.constraint == {"json": FUNCTION["parameters"]}
    fake.reply = "No tools today."
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, functions=[FUNCTION], function_call="none"
    )
    assert reply.choices[0].message.content == "No tools today."
    assert "get_weather" not in fake.calls[-1].prompt


async def test_a_legacy_function_call_and_its_result_render_as_a_tool_round_trip(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = "It is sunny in Paris."
    messages = [
        *USER_HI,
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"role": "function", "name": "get_weather", "content": "22 C, sunny"},
    ]
    reply = await client.chat.completions.create(
        model="fake-chat", messages=messages, functions=[FUNCTION]
    )
    assert reply.choices[0].message.content == "It is sunny in Paris."
    prompt = fake.calls[-1].prompt
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<|im_start|>tool\n22 C, sunny" in prompt


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"functions": [FUNCTION], "tools": [WEATHER]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"functions": [FUNCTION], "function_call": {"name": "nope"}}, "function_call"),
        (
            {"functions": [{"name": "f", "parameters": {"type": 5}}]},
            "functions.[0].parameters",
        ),
        (
            {
                "functions": [FUNCTION],
                "messages": [{"role": "function", "name": "get_weather", "content": "x"}],
            },
            "messages.[0].name",
        ),
    ],
)
async def test_bad_legacy_function_input_is_400_naming_it(
    http: httpx.AsyncClient, fake: FakeBackend, fields: dict[str, object], param: str
) -> None:
    response = await http.post("/v1/chat/completions", json=chat_body(**fields))
    assert_openai_error(response, 400, param=param)
    assert fake.calls == []


# Issue 24: a strict tool's arguments are checked on the event loop, so no client schema
# may make that check slow: patterns are matched by RE2 (linear time), and the whole check
# stops after STRICT_CHECK_S.

REDOS = "^(a+)+$"
#: Python's re takes 2**n steps to fail this (seconds here, hours for 40 a's).
ATTACK = "a" * 28 + "!"


def strict_tool(parameters: dict[str, object]) -> dict[str, object]:
    return {
        "type": "function",
        "function": {"name": "run", "parameters": parameters, "strict": True},
    }


def call_of(arguments: str) -> str:
    return f'<tool_call> {{"name": "run", "arguments": {arguments}}} </tool_call>'


@pytest.mark.parametrize(
    ("parameters", "bad", "good"),
    [
        (
            {"type": "object", "properties": {"code": {"type": "string", "pattern": REDOS}}},
            {"code": ATTACK},
            {"code": "aaaa"},
        ),
        # A subschema that names its dialect is still matched by RE2 (jsonschema would
        # check it with that dialect's own validator, and Python's re).
        (
            {
                "type": "object",
                "properties": {
                    "code": {
                        "$schema": "http://json-schema.org/draft-07/schema#",
                        "type": "string",
                        "pattern": REDOS,
                    }
                },
            },
            {"code": ATTACK},
            {"code": "aaaa"},
        ),
        (
            {
                "type": "object",
                "patternProperties": {REDOS: {"type": "string"}},
                "additionalProperties": False,
            },
            {ATTACK: "x"},
            {"aaaa": "x"},
        ),
    ],
)
async def test_a_backtracking_pattern_in_a_strict_schema_is_checked_in_linear_time(
    client: openai.AsyncOpenAI,
    fake: FakeBackend,
    parameters: dict[str, object],
    bad: dict[str, str],
    good: dict[str, str],
) -> None:
    fake.replies = [call_of(json.dumps(bad).replace(" ", "")), json.dumps(good)]
    started = time.perf_counter()
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, tools=[strict_tool(parameters)]
    )
    assert time.perf_counter() - started < 2
    # The arguments broke the pattern, so they were generated again under the schema.
    assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments) == good
    assert len(fake.calls) == 2


def doubling(levels: int) -> dict[str, object]:
    """A schema whose check takes 2**levels steps: each level refers to the next twice."""
    defs: dict[str, object] = {
        f"l{i}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"l{levels}"] = {"type": "object"}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "parameters",
    [
        {"$ref": "#"},  # references that recurse without end (was a RecursionError, a 500)
        {"$ref": "http://127.0.0.1:9/schema.json"},  # jsonschema fetched it from the gateway
        doubling(40),
    ],
)
async def test_a_strict_schema_that_cannot_be_checked_is_a_400_naming_the_tool(
    http: httpx.AsyncClient, fake: FakeBackend, parameters: dict[str, object], stream: bool
) -> None:
    fake.reply = call_of('{"x": 1}')
    started = time.perf_counter()
    response = await http.post(
        "/v1/chat/completions", json=chat_body(tools=[strict_tool(parameters)], stream=stream)
    )
    assert time.perf_counter() - started < 3
    if stream:
        [error] = [e["error"] for e in sse_json(response.text) if "error" in e]
        assert error["code"] == "uncheckable_schema"
    else:
        error = assert_openai_error(response, 400, param="tools", code="uncheckable_schema")
    assert "'run'" in error["message"]


async def test_arguments_nested_past_the_bound_are_generated_again(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    # A recursive schema: checking 300 levels of arguments recursed past Python's limit.
    tree = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}
    fake.replies = [call_of("[" * 300 + "]" * 300), "[[]]"]
    reply = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, tools=[strict_tool(tree)]
    )
    assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments) == [[]]
    assert len(fake.calls) == 2


async def test_a_strict_schema_whose_patterns_python_would_match_is_refused_up_front(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # jsonschema's unevaluatedProperties matches patternProperties with Python's re.
    parameters = {
        "type": "object",
        "patternProperties": {REDOS: {"type": "string"}},
        "unevaluatedProperties": False,
    }
    response = await http.post(
        "/v1/chat/completions", json=chat_body(tools=[strict_tool(parameters)])
    )
    assert_openai_error(
        response, 400, param="tools.[0].function.parameters", code="unsupported_parameter"
    )
    assert fake.calls == []
