"""/v1/responses through the official SDK against the fake backend (which answers
``fake.reply`` word by word) and a real Redis: output items, stored conversations,
retrieval, input items, deletion, per-key isolation, streaming events, tools, parse, errors,
logprobs, the bounds on what is stored, and parameters refused rather than ignored."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.backend import ModelInfo
from gateway.backend.fake import TOOLS_TEMPLATE, FakeBackend
from gateway.stack.redis_server import EmbeddedRedis
from tests.support.backends import long_model
from tests.support.bodies import assert_openai_error, response_events
from tests.support.inprocess import REPLY, new_key, sdk
from tests.support.shapes import CALL, City

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


async def test_create_returns_a_message_item_usage_and_output_text(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    response = await client.responses.create(model="fake-chat", input="Hi there")
    assert response.id.startswith("resp_") and len(response.id) > 40
    assert response.object == "response" and response.status == "completed"
    assert response.output_text == fake.reply
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert response.usage is not None
    assert response.usage.output_tokens == len(fake.reply.split())
    assert response.usage.total_tokens == response.usage.input_tokens + 5
    assert "Hi there" in fake.calls[-1].prompt


async def test_instructions_become_the_system_message_and_are_not_carried_over(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    first = await client.responses.create(
        model="fake-chat", input="My name is Ada.", instructions="Answer like a pirate."
    )
    assert "system\nAnswer like a pirate." in fake.calls[-1].prompt
    await client.responses.create(
        model="fake-chat", input="What is my name?", previous_response_id=first.id
    )
    prompt = fake.calls[-1].prompt
    assert "pirate" not in prompt
    # The stored conversation comes first: the earlier input and the earlier output.
    assert prompt.index("My name is Ada.") < prompt.index(fake.reply) < prompt.index("my name?")


async def test_retrieve_input_items_and_delete(client: openai.AsyncOpenAI) -> None:
    items = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "three"}]},
    ]
    created = await client.responses.create(model="fake-chat", input=items)  # type: ignore[arg-type]
    fetched = await client.responses.retrieve(created.id)
    assert fetched.output_text == created.output_text and fetched.id == created.id

    listed = await client.responses.input_items.list(created.id)
    texts = [item.content[0].text for item in listed.data]  # type: ignore[union-attr]
    assert texts == ["three", "two", "one"]  # newest first, as OpenAI lists
    first_page = await client.responses.input_items.list(created.id, order="asc", limit=2)
    assert [i.content[0].text for i in first_page.data] == ["one", "two"]  # type: ignore[union-attr]
    assert first_page.has_more is True
    rest = await client.responses.input_items.list(
        created.id, order="asc", after=first_page.data[-1].id
    )
    assert [i.content[0].text for i in rest.data] == ["three"]  # type: ignore[union-attr]
    assert rest.has_more is False

    await client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(
            model="fake-chat", input="again", previous_response_id=created.id
        )


async def test_another_keys_response_is_a_404_exactly_as_an_unknown_id(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    mine = await client.responses.create(model="fake-chat", input="secret plans")
    other = sdk(http, (await new_key(http))["key"])
    theirs = await other.responses.with_raw_response.create(model="fake-chat", input="hello")
    assert theirs.status_code == 200
    key = other.api_key
    for path in (f"/v1/responses/{mine.id}", f"/v1/responses/{mine.id}/input_items"):
        stolen = await http.get(path, headers={"Authorization": f"Bearer {key}"})
        unknown = await http.get(
            path.replace(mine.id, "resp_" + "0" * 48), headers={"Authorization": f"Bearer {key}"}
        )
        stolen_error = assert_openai_error(stolen, 404)
        unknown_error = assert_openai_error(unknown, 404)
        assert stolen_error["message"].replace(mine.id, "X") == unknown_error["message"].replace(
            "resp_" + "0" * 48, "X"
        )
    with pytest.raises(openai.NotFoundError):
        await other.responses.create(model="fake-chat", input="hi", previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.delete(mine.id)
    assert (await client.responses.retrieve(mine.id)).id == mine.id  # still there


async def test_store_false_keeps_nothing(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(model="fake-chat", input="Hi", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response.id)


async def test_stream_sends_the_event_sequence_in_order(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    reply = await http.post(
        "/v1/responses", json={"model": "fake-chat", "input": "Hi", "stream": True}
    )
    assert reply.status_code == 200
    events = response_events(reply.text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas == len(fake.reply.split())
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == fake.reply == events[-1]["response"]["output"][0]["content"][0]["text"]
    assert events[-1]["response"]["usage"]["output_tokens"] == deltas


async def test_sdk_stream_helper_and_stored_streamed_response(client: openai.AsyncOpenAI) -> None:
    async with client.responses.stream(model="fake-chat", input="Hi") as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text
    assert (await client.responses.retrieve(final.id)).output_text == final.output_text


async def test_function_call_and_round_trip(client: openai.AsyncOpenAI, fake: FakeBackend) -> None:
    fake.reply = CALL
    first = await client.responses.create(
        model="fake-chat",
        input="Weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.id and call.id.startswith("fc_")
    fake.reply = "It is sunny in Paris."
    second = await client.responses.create(
        model="fake-chat",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert second.output_text == "It is sunny in Paris."
    prompt = fake.calls[-1].prompt
    assert prompt.index('"get_weather"') < prompt.index("sunny")  # the call, then its result


async def test_streamed_function_call_events(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.reply = CALL
    reply = await http.post(
        "/v1/responses",
        json={"model": "fake-chat", "input": "Weather?", "tools": [WEATHER], "stream": True},
    )
    events = response_events(reply.text)
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert json.loads(done["arguments"]) == {"city": "Paris"}
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "function_call" and added["item"]["name"] == "get_weather"
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]] == ["function_call"]


async def test_forced_tool_choice_sends_a_constraint(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = CALL
    await client.responses.create(
        model="fake-chat",
        input="Weather?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert fake.calls[-1].options.constraint is not None


async def test_parse_with_a_pydantic_model(client: openai.AsyncOpenAI, fake: FakeBackend) -> None:
    fake.reply = '{"name": "Oslo", "population": 709000}'
    parsed = await client.responses.parse(model="fake-chat", input="Oslo?", text_format=City)
    assert parsed.output_parsed == City(name="Oslo", population=709000)
    constraint = fake.calls[-1].options.constraint
    assert constraint is not None and "json" in constraint


async def test_max_output_tokens_makes_it_incomplete(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(model="fake-chat", input="Hi", max_output_tokens=2)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 2


async def test_error_after_the_stream_started(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.fail_after_tokens = 2
    reply = await http.post(
        "/v1/responses", json={"model": "fake-chat", "input": "Hi", "stream": True}
    )
    events = response_events(reply.text)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["message"]
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["message"] == events[-2]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": None}]}]},
            "input[0].content[0].text",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        (
            {"input": [{"type": "reasoning", "encrypted_content": "x"}]},
            "input[0].encrypted_content",
        ),
        (
            {"input": [{"type": "reasoning", "content": [{"type": "input_text", "text": "x"}]}]},
            "input[0].content[0]",
        ),
        ({"input": []}, "input"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}},
            "text.format.schema",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
            "input[0].call_id",
        ),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"background": True, "store": False}, "store"),
    ],
)
async def test_bad_input_is_a_400_naming_the_parameter(
    http: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    reply = await http.post("/v1/responses", json={"model": "fake-chat", "input": "Hi", **body})
    assert_openai_error(reply, 400, param=param)


def _models(fake: FakeBackend) -> None:
    """Chat models that lack what a request may need: one taking only top_p, one enforcing
    no schema (with a tool-call parser), one whose template refuses every conversation."""
    fake.model_list += [
        ModelInfo("fake-top-p", "chat", True, TOOLS_TEMPLATE, 2048, takes=frozenset({"top_p"})),
        ModelInfo("fake-no-json", "chat", True, TOOLS_TEMPLATE, 2048, tool_call_parser="hermes"),
        ModelInfo("fake-refuses", "chat", True, "{{ raise_exception('no, thanks') }}", 2048),
    ]


DEEP = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 10**7}}}
NO_JSON = {"model": "fake-no-json"}


@pytest.mark.parametrize(
    ("body", "param", "code", "says"),
    [
        ({"max_output_tokens": 2048}, "max_output_tokens", "context_length_exceeded", None),
        (
            {"model": "fake-top-p", "max_output_tokens": 5},
            "max_output_tokens",
            "unsupported_parameter",
            "does not take 'max_output_tokens'",
        ),
        ({"input": "word " * 20_000}, "input", "context_length_exceeded", None),
        ({"model": "fake-refuses"}, "input", None, "no, thanks"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_file", "file_id": "f"},
                        ],
                    }
                ]
            },
            "input[0].content[1].type",
            None,
            None,
        ),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": [{"type": "x"}]},
                ]
            },
            "input[1].output[0].type",
            None,
            "'x'",
        ),
        (
            {"input": [{"role": "user", "content": "Hi"}, {"type": "function_call_output"}]},
            "input[1].call_id",
            None,
            None,
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "deep", "schema": DEEP}}},
            "text.format.schema.properties.a.maxLength",
            "schema_too_large",
            None,
        ),
        (
            {**NO_JSON, "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}},
            "text.format",
            "unsupported_parameter",
            None,
        ),
        ({**NO_JSON, "text": {"format": {"type": "json_object"}}}, "text.format", None, None),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "text": {"format": {"type": "json_object"}},
            },
            "text.format",
            None,
            "text.format cannot be combined",
        ),
        (
            {"tools": [{**WEATHER, "name": "get weather"}]},
            "tools[0].name",
            "invalid_value",
            "'get weather'",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].name", None, "Two tools"),
        (
            {"tools": [WEATHER, {**WEATHER, "name": "other", "parameters": {"type": 5}}]},
            "tools[1].parameters",
            "invalid_json_schema",
            None,
        ),
        (
            {"tools": [{**WEATHER, "parameters": DEEP}], "tool_choice": "required"},
            "tools[0].parameters.properties.a.maxLength",
            "schema_too_large",
            None,
        ),
        ({**NO_JSON, "tools": [{**WEATHER, "strict": True}]}, "tools[0].strict", None, None),
        (
            {
                "tools": [
                    {
                        **WEATHER,
                        "strict": True,
                        "parameters": {
                            "patternProperties": {"a": {}},
                            "unevaluatedProperties": False,
                        },
                    }
                ]
            },
            "tools[0].parameters",
            "unsupported_parameter",
            None,
        ),
        ({"tool_choice": "required"}, "tool_choice", None, "only allowed when tools"),
        ({"model": "fake-plain", "tools": [WEATHER]}, "tools", "unsupported_parameter", None),
        (
            {**NO_JSON, "tools": [WEATHER], "tool_choice": "required"},
            "tool_choice",
            "unsupported_parameter",
            None,
        ),
    ],
)
async def test_what_the_model_or_the_chat_path_refuses_names_the_responses_parameter(
    http: httpx.AsyncClient,
    fake: FakeBackend,
    body: dict[str, Any],
    param: str,
    code: str | None,
    says: str | None,
) -> None:
    _models(fake)
    reply = await http.post("/v1/responses", json={"model": "fake-chat", "input": "Hi", **body})
    error = assert_openai_error(reply, 400, param=param)
    if code is not None:
        assert error["code"] == code, error
    if says is not None:
        assert says in error["message"], error
    for chat_name in ("max_completion_tokens", "response_format", "messages.[", "tool_call_id"):
        assert chat_name not in error["message"], error
    assert fake.calls == []


async def test_a_function_call_output_answers_a_call_of_the_chain_or_of_the_input(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = CALL
    first = await client.responses.create(model="fake-chat", input="Weather?", tools=[WEATHER])  # type: ignore[list-item]
    (call,) = first.output
    assert call.type == "function_call"
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    body = {"model": "fake-chat", "input": [answer]}
    alone = await http.post("/v1/responses", json=body)
    error = assert_openai_error(alone, 400, param="input[0].call_id")
    assert call.call_id in error["message"]
    chained = await http.post("/v1/responses", json={**body, "previous_response_id": first.id})
    assert chained.status_code == 200, chained.text
    made = {"type": "function_call", "call_id": call.call_id, "name": "get_weather"}
    inline = await http.post("/v1/responses", json={**body, "input": [made, answer]})
    assert inline.status_code == 200, inline.text
    backwards = await http.post("/v1/responses", json={**body, "input": [answer, made]})
    assert_openai_error(backwards, 400, param="input[0].call_id")


async def test_unknown_previous_response_is_a_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.responses.create(
            model="fake-chat", input="hi", previous_response_id="resp_unknown"
        )
    assert "resp_unknown" in caught.value.message


async def test_client_going_away_cancels_the_generation_and_stores_nothing(
    stream_http: httpx.AsyncClient, fake: FakeBackend, client: openai.AsyncOpenAI
) -> None:
    fake.reply = " ".join(f"w{i}" for i in range(50))
    fake.token_delay_s = 0.01
    body = {"model": "fake-chat", "input": "Hi", "stream": True}
    response_id = None
    async with stream_http.stream("POST", "/v1/responses", json=body) as response:
        async for line in response.aiter_lines():
            if '"response.created"' in line and line.startswith("data: "):
                response_id = json.loads(line.removeprefix("data: "))["response"]["id"]
            if '"delta": "w' in line:
                break  # leaving the block closes the response: the client went away
    call = fake.calls[-1]
    assert call.cancelled is True and 0 < call.tokens_sent < 50
    assert response_id is not None
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response_id)


async def test_usage_and_limits_count_responses(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    created = await new_key(http, rpm=2)
    user = sdk(http, created["key"])
    first = await user.responses.create(model="fake-chat", input="Hi")
    await user.responses.create(model="fake-chat", input="Hi", stream=True)
    with pytest.raises(openai.RateLimitError):
        await user.responses.create(model="fake-chat", input="Hi")
    usage = (await http.get(f"/admin/keys/{created['id']}/usage")).json()
    assert first.usage is not None
    assert usage["requests"] == 2
    assert usage["completion_tokens"] == 2 * len(fake.reply.split())
    assert usage["prompt_tokens"] == 2 * first.usage.input_tokens


async def test_metadata_is_bounded_as_openai_bounds_it(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    most = {f"k{i:02}" + "k" * 61: "v" * 512 for i in range(16)}
    response = await client.responses.create(model="fake-chat", input="Hi", metadata=most)
    assert (await client.responses.retrieve(response.id)).metadata == most
    for metadata in (
        {**most, "one": "more"},
        {"k" * 65: "v"},
        {"k": "v" * 513},
    ):
        reply = await http.post(
            "/v1/responses", json={"model": "fake-chat", "input": "Hi", "metadata": metadata}
        )
        error = assert_openai_error(reply, 400)
        assert error["param"].startswith("metadata")


async def test_a_response_too_large_to_store_is_refused_before_generating(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # Stored twice (as input items and as chat messages): about 1.2 MB of JSON.
    body = {"model": long_model(fake), "input": "x" * 600_000}
    error = assert_openai_error(await http.post("/v1/responses", json=body), 400, param="store")
    assert "GATEWAY_MAX_STORED_KB" in error["message"] and "1024 KB" in error["message"]
    assert fake.calls == []
    unstored = await http.post("/v1/responses", json={**body, "store": False})
    assert unstored.status_code == 200


async def test_an_answer_that_makes_the_record_too_large_is_not_stored(
    http: httpx.AsyncClient, fake: FakeBackend, client: openai.AsyncOpenAI
) -> None:
    # The input fits the store (about 0.95 MB recorded); with the answer (50 KB, recorded
    # twice) the response does not.
    fake.reply = " ".join(["y" * 99] * 500)
    body = {"model": long_model(fake), "input": "x" * 490_000}
    assert_openai_error(await http.post("/v1/responses", json=body), 400, param="store")
    streamed = await http.post("/v1/responses", json={**body, "stream": True})
    events = response_events(streamed.text)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert "GATEWAY_MAX_STORED_KB" in events[-2]["message"]
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(events[0]["response"]["id"])


async def test_tools_not_offered_tool_choice_none_are_stored_by_name_only(
    client: openai.AsyncOpenAI, fake: FakeBackend, redis_server: EmbeddedRedis
) -> None:
    # The attack: a 200 KB description that the model is never shown (tool_choice none),
    # stored for 30 days for the price of a few tokens.
    tool = {**WEATHER, "description": "d" * 200_000}
    response = await client.responses.create(
        model="fake-chat",
        input="Hi",
        tools=[tool],  # type: ignore[list-item]
        tool_choice="none",
    )
    assert "d" * 100 not in fake.calls[-1].prompt  # it shaped nothing
    assert response.tools[0].description == tool["description"]  # answered as sent
    with redis.Redis.from_url(redis_server.url) as store:
        (name,) = store.keys(f"gw:response:*:{response.id}")
        assert int(store.strlen(name)) < 3_000
    fetched = await client.responses.retrieve(response.id)
    assert [t.model_dump(exclude_none=True) for t in fetched.tools] == [
        {"type": "function", "name": "get_weather"}
    ]
    follow = await client.responses.create(
        model="fake-chat", input="And now?", previous_response_id=response.id
    )
    assert follow.status == "completed" and follow.tools == []  # tools are per request
    # Tools the model was shown shaped the answer: kept whole.
    shown = await client.responses.create(
        model="fake-chat",
        input="Hi",
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert WEATHER["description"] in fake.calls[-1].prompt
    kept = (await client.responses.retrieve(shown.id)).tools[0]
    assert kept.model_dump(exclude_none=True) == WEATHER


async def test_input_items_of_a_chained_response_list_the_conversation_it_answered(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    first = await client.responses.create(model="fake-chat", input="one")
    fake.reply = "four"
    second = await client.responses.create(
        model="fake-chat",
        input=[{"role": "user", "content": "three"}],
        previous_response_id=first.id,
    )
    listed = await client.responses.input_items.list(second.id)
    texts = [item.content[0].text for item in listed.data]  # type: ignore[union-attr]
    assert texts == ["three", first.output_text, "one"]
    assert listed.data[1].id == first.output[0].id  # the earlier output item, as it was
    assert [i.type for i in listed.data] == ["message"] * 3
    assert [i.role for i in listed.data] == ["user", "assistant", "user"]  # type: ignore[union-attr]
    oldest = await client.responses.input_items.list(second.id, order="asc", limit=2)
    assert [i.content[0].text for i in oldest.data] == ["one", first.output_text]  # type: ignore[union-attr]
    assert oldest.has_more is True
    rest = await client.responses.input_items.list(second.id, order="asc", after=oldest.last_id)
    assert [i.content[0].text for i in rest.data] == ["three"]  # type: ignore[union-attr]
    # The chain is copied: deleting the first response leaves the second's listing whole.
    await client.responses.delete(first.id)
    assert len((await client.responses.input_items.list(second.id)).data) == 3


async def test_output_text_logprobs_when_included(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    response = await client.responses.create(
        model="fake-chat",
        input="Hi",
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    (part,) = response.output[0].content  # type: ignore[union-attr]
    assert part.logprobs is not None
    assert "".join(lp.token for lp in part.logprobs) == part.text == fake.reply
    first = part.logprobs[0]
    assert first.logprob == pytest.approx(-0.1) and first.bytes == list(b"Hello")
    assert [alt.token for alt in first.top_logprobs] == ["Hello", "alt1"]
    assert fake.calls[-1].options.logprobs == 2
    plain = await client.responses.create(model="fake-chat", input="Hi")
    assert plain.output[0].content[0].logprobs == []  # type: ignore[union-attr]


async def test_streamed_logprobs_come_with_each_delta(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    body = {
        "model": "fake-chat",
        "input": "Hi",
        "stream": True,
        "include": ["message.output_text.logprobs"],
    }
    events = response_events((await http.post("/v1/responses", json=body)).text)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert all(len(d["logprobs"]) == 1 and d["logprobs"][0]["token"] == d["delta"] for d in deltas)
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == [d["logprobs"][0] for d in deltas]
    final = events[-1]["response"]["output"][0]["content"][0]
    assert final["logprobs"] == done["logprobs"] and final["logprobs"][0]["top_logprobs"] == []


async def test_max_tool_calls_keeps_the_first_calls(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    other = CALL.replace("Paris", "Oslo")
    fake.reply = CALL + other
    both = await client.responses.create(
        model="fake-chat",
        input="Weather?",
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert [item.type for item in both.output] == ["function_call", "function_call"]
    one = await client.responses.create(
        model="fake-chat",
        input="Weather?",
        tools=[WEATHER],  # type: ignore[list-item]
        max_tool_calls=1,
    )
    assert one.max_tool_calls == 1
    (call,) = one.output
    assert json.loads(call.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    body = {"model": "fake-chat", "input": "Weather?", "tools": [WEATHER], "max_tool_calls": 1}
    events = response_events((await http.post("/v1/responses", json={**body, "stream": True})).text)
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert len(added) == 1
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["function_call"]
    zero = await http.post("/v1/responses", json={**body, "max_tool_calls": 0})
    assert_openai_error(zero, 400, param="max_tool_calls")


async def test_hints_are_accepted_and_echoed(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model="fake-chat",
        input="Hi",
        user="u-1",
        safety_identifier="hashed-user",
        prompt_cache_key="cache-1",
        service_tier="flex",
        truncation="disabled",
        reasoning={"effort": None},
    )
    assert response.status == "completed" and response.user == "u-1"
    assert response.safety_identifier == "hashed-user"
    assert response.prompt_cache_key == "cache-1"
    assert response.service_tier == "default"  # the tier that served it
    assert response.truncation == "disabled"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"reasoning": {"context": "all_turns"}}, "reasoning.context"),
        ({"reasoning": {"mode": "pro"}}, "reasoning.mode"),
        ({"include": ["file_search_call.results"]}, "include[0]"),
        ({"context_management": [{"type": "compaction"}]}, "context_management"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"background_options": {"continuation_id": "c_1"}}, "background_options.continuation_id"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"include": ["message.output_text.logprobs"], "top_logprobs": 6}, "top_logprobs"),
        ({"model": "fake-plain", "include": ["message.output_text.logprobs"]}, "include"),
    ],
)
async def test_parameters_it_cannot_honour_are_refused_with_the_reason(
    http: httpx.AsyncClient, fake: FakeBackend, body: dict[str, Any], param: str
) -> None:
    reply = await http.post("/v1/responses", json={"model": "fake-chat", "input": "Hi", **body})
    error = assert_openai_error(reply, 400, param=param, code="unsupported_parameter")
    assert not error["message"].startswith("Unrecognized")  # understood, not unknown
    assert fake.calls == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text": {"format": {"type": "text", "extra": 1}}}, "text.format.extra"),
        ({"tools": [{**WEATHER, "deferred": True}]}, "tools.[0].deferred"),
    ],
)
async def test_unknown_fields_of_text_and_tools_are_refused(
    http: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    reply = await http.post("/v1/responses", json={"model": "fake-chat", "input": "Hi", **body})
    assert_openai_error(reply, 400, param=param, code="unsupported_parameter")


@pytest.mark.parametrize("stream", [False, True])
async def test_strict_function_arguments_that_break_the_schema_are_generated_again(
    http: httpx.AsyncClient, fake: FakeBackend, stream: bool
) -> None:
    bad = '<tool_call> {"name": "get_weather", "arguments": {"town": 5}} </tool_call>'
    fake.replies = [bad, '{"city": "Lyon"}']
    strict = {**WEATHER, "strict": True}
    body = {"model": "fake-chat", "input": "Weather?", "tools": [strict], "stream": stream}
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    if stream:
        events = response_events(reply.text)
        deltas = [
            e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
        ]
        assert deltas == ['{"city": "Lyon"}']  # held back until checked
        response = events[-1]["response"]
    else:
        response = reply.json()
    (call,) = response["output"]
    assert json.loads(call["arguments"]) == {"city": "Lyon"}
    first, again = fake.calls
    assert again.prompt == first.prompt + '<tool_call> {"name": "get_weather", "arguments":'
    assert again.options.constraint == {"json": WEATHER["parameters"]}


async def test_an_earlier_output_sent_back_as_input_is_taken_and_unknown_fields_refused(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    first = await client.responses.create(model="fake-chat", input="Hi")
    # The output items as the SDK sends them back (only what the server gave: status,
    # annotations and logprobs on the parts).
    again = await client.responses.create(
        model="fake-chat",
        input=[
            *(i.model_dump(exclude_unset=True) for i in first.output),
            {"role": "user", "content": "More"},
        ],
    )
    assert again.status == "completed"
    assert REPLY in fake.calls[-1].prompt
    bad = {"model": "fake-chat", "input": [{"role": "user", "content": "Hi", "colour": 1}]}
    error = assert_openai_error(await http.post("/v1/responses", json=bad), 400)
    assert "colour" in error["message"]
