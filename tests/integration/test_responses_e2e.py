"""/v1/responses end to end: the official openai client -> nginx (or one replica directly)
-> gateway -> real Triton (smollm2, mock_chat), conversations stored in the real Redis."""

from __future__ import annotations

import json

import httpx
import openai
import pydantic
import pytest
import redis

from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.item_index import entry_bytes
from gateway.state.stored_bytes import RECORD_OVERHEAD
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


class City(pydantic.BaseModel):
    name: str
    country: str


class Poem(pydantic.BaseModel):
    poem: str


def replica_client(stack: GatewayProcess, address: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{address}/v1", api_key=stack.admin_key, max_retries=0)


def test_conversation_continues_on_another_replica(stack: GatewayProcess) -> None:
    first_replica, second_replica = (replica_client(stack, a) for a in stack.replica_addresses())
    first = first_replica.responses.create(
        model="mock_chat", input="remember the word pineapple", max_output_tokens=5
    )
    assert first.usage is not None
    second = second_replica.responses.create(
        model="mock_chat", input="which word?", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id and second.usage is not None
    # mock_chat counts a prompt's words: the second prompt holds the whole first exchange.
    assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens + 2
    fetched = first_replica.responses.retrieve(second.id)
    assert fetched.output_text == second.output_text
    items = second_replica.responses.input_items.list(first.id)
    assert [i.content[0].text for i in items.data] == ["remember the word pineapple"]  # type: ignore[union-attr]


def test_stream_events_in_order(client: openai.OpenAI) -> None:
    stream = client.responses.create(model="mock_chat", input="Name three colors.", stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert text and text == final.output_text
    assert final.usage is not None and final.usage.output_tokens > 0


def test_stream_helper_and_parse(client: openai.OpenAI) -> None:
    with client.responses.stream(model="mock_chat", input="Say hello.") as stream:
        final = stream.get_final_response()
    assert final.output_text == "The quick brown fox jumps over the lazy dog."
    parsed = client.responses.parse(
        model="smollm2",
        input="Give the capital of France as JSON with name and country.",
        text_format=City,
        temperature=0,
        max_output_tokens=64,
    )
    assert isinstance(parsed.output_parsed, City)


def test_constrained_strings_are_valid_json_even_when_the_model_wants_a_raw_tab(
    client: openai.OpenAI,
) -> None:
    # An earlier answer with raw tabs inside a JSON string makes smollm2 write them again;
    # JSON forbids raw control characters in strings, so the grammar must too (parse fails
    # on a raw tab).
    parsed = client.responses.parse(
        model="smollm2",
        input=[
            {"role": "user", "content": "Answer with tabs between words: red green blue"},
            {"role": "assistant", "content": '{"poem": "red\tgreen\tblue"}'},
            {"role": "user", "content": "Now: one two three"},
        ],
        text_format=Poem,
        temperature=0,
        max_output_tokens=32,
    )
    assert isinstance(parsed.output_parsed, Poem)


def test_a_schema_is_enforced_exactly_or_refused(client: openai.OpenAI) -> None:
    # A backslash in an enum value is JSON's escape, not the grammar's: the value comes back
    # as it was given.
    path = {
        "type": "object",
        "properties": {"path": {"enum": ["C:\\dir", 'a"b']}},
        "required": ["path"],
        "additionalProperties": False,
    }
    answer = client.responses.create(
        model="smollm2",
        input="Which path?",
        text={"format": {"type": "json_schema", "name": "path", "schema": path}},
        temperature=0,
        max_output_tokens=16,
    )
    assert json.loads(answer.output_text)["path"] in path["properties"]["path"]["enum"]
    # A grammar llama.cpp cannot parse would constrain nothing: refused instead (the error
    # a model sends on its stream carries no status, so it reads as the model's failure).
    digits = {"type": "object", "properties": {"n": {"type": "string", "pattern": "^\\d+$"}}}
    with pytest.raises(openai.APIStatusError, match="cannot enforce this JSON schema"):
        client.responses.create(
            model="smollm2",
            input="A number?",
            text={"format": {"type": "json_schema", "name": "digits", "schema": digits}},
            max_output_tokens=8,
        )


def test_function_tool_round_trip_on_smollm2(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="smollm2",
        input="What is the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    answer = client.responses.create(
        model="smollm2",
        previous_response_id=first.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": calls[0].call_id,
                "output": '{"celsius": 7, "sky": "clear"}',
            }
        ],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
        temperature=0,
        max_output_tokens=32,
    )
    assert answer.output_text
    assert all(item.type == "message" for item in answer.output)


def test_delete_and_another_keys_404(stack: GatewayProcess, client: openai.OpenAI) -> None:
    mine = client.responses.create(model="mock_chat", input="hello", max_output_tokens=3)
    stranger = stack.client(stack.user_headers()["Authorization"].removeprefix("Bearer "))
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.create(model="mock_chat", input="hi", previous_response_id=mine.id)
    client.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(mine.id)


def test_bad_input_and_a_chain_too_long(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="mock_chat", input="hi", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    assert caught.value.body["param"] == "tools[0].type"  # type: ignore[index]
    # mock_chat's context is 32,768 tokens, a word a token: the chain passes it.
    long = client.responses.create(model="mock_chat", input="word " * 20_000, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="mock_chat", input="word " * 15_000, previous_response_id=long.id
        )
    assert caught.value.code == "context_length_exceeded"


def test_tools_the_model_was_not_shown_are_not_stored_whole(
    stack: GatewayProcess, redis_store: EmbeddedRedis
) -> None:
    """The attack: a 100 KB tool description sent with tool_choice "none" (never shown to
    the model, a few tokens' cost) kept for 30 days. Stored, the record keeps the tool's
    name only, and the key's stored bytes count that."""
    created = stack.create_key("tool_choice none")
    client = stack.client(created["key"])
    tool = {**WEATHER, "description": "Weather. " * 11_000}
    response = client.responses.create(
        model="mock_chat",
        input="hi",
        tools=[tool],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=2,
    )
    assert response.usage is not None and response.usage.input_tokens < 50  # never shown
    with redis.Redis.from_url(redis_store.url) as store:
        size = int(store.strlen(f"gw:response:{created['id']}:{response.id}"))
    assert 0 < size < 3_000, size
    fetched = client.responses.retrieve(response.id)
    items = [*client.responses.input_items.list(response.id), *fetched.output]
    assert [t.model_dump(exclude_none=True) for t in fetched.tools] == [
        {"type": "function", "name": "get_weather"}
    ]
    me = httpx.get(
        stack.base_url + "/v1/me", headers={"Authorization": f"Bearer {created['key']}"}
    ).json()
    # The record, and the index entries of its two items (for item_reference).
    index = entry_bytes(created["id"], f"response:{response.id}", [i.id for i in items])
    assert me["storage"]["key"]["used_bytes"] == size + RECORD_OVERHEAD + index + RECORD_OVERHEAD
