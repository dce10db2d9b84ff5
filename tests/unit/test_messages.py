"""/v1/messages (Anthropic's Messages API) through the official ``anthropic`` SDK against the
fake backend (which answers ``fake.reply`` word by word) and a real Redis: text, system,
multi-turn, streaming events, a tool round trip, thinking from a reasoning model,
max_tokens, count_tokens, errors in Anthropic's shape, keys (``x-api-key``, a model
allow-list) and fields refused by name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from fastapi import FastAPI

from gateway.backend.fake import FakeBackend
from tests.support.inprocess import ADMIN_KEY, BASE_URL, REPLY, new_key
from tests.support.shapes import CALL, CLAUDE_WEATHER

HI = [{"role": "user", "content": "Hi there"}]


@pytest.fixture
async def plain(app: FastAPI) -> AsyncIterator[httpx2.AsyncClient]:
    """A client on the app that sends no key of its own (the SDK sends ``x-api-key``);
    httpx2, the fork of httpx the anthropic SDK is built on."""
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url=BASE_URL
    ) as client:
        yield client


def claude(http: httpx2.AsyncClient, key: str = ADMIN_KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=BASE_URL, api_key=key, http_client=http, max_retries=0)


async def test_a_message_answers_with_text_usage_and_end_turn(
    plain: httpx2.AsyncClient, fake: FakeBackend
) -> None:
    message = await claude(plain).messages.create(
        model="fake-chat", max_tokens=64, system="Be brief.", messages=HI
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == "fake-chat"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == REPLY  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == len(REPLY.split())
    prompt = fake.calls[-1].prompt
    assert prompt.index("Be brief.") < prompt.index("Hi there")


async def test_max_tokens_cuts_the_answer_and_says_so(plain: httpx2.AsyncClient) -> None:
    message = await claude(plain).messages.create(model="fake-chat", max_tokens=2, messages=HI)
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 2
    assert message.content[0].text == " ".join(REPLY.split()[:2])  # type: ignore[union-attr]


async def test_a_stop_sequence_ends_the_answer_and_is_named_whole_and_streamed(
    plain: httpx2.AsyncClient,
) -> None:
    stop = REPLY.split()[3]
    asked = {"model": "fake-chat", "max_tokens": 64, "messages": HI}
    message = await claude(plain).messages.create(**asked, stop_sequences=["zzz", stop])
    assert message.content[0].text == REPLY[: REPLY.index(stop)]  # type: ignore[union-attr]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)
    async with claude(plain).messages.stream(**asked, stop_sequences=[stop]) as stream:
        deltas = [event async for event in stream if event.type == "message_delta"]
        final = await stream.get_final_message()
    assert (deltas[0].delta.stop_reason, deltas[0].delta.stop_sequence) == ("stop_sequence", stop)
    assert final.content[0].text == message.content[0].text  # type: ignore[union-attr]
    unmet = await claude(plain).messages.create(**asked, stop_sequences=["zzz"])
    assert (unmet.stop_reason, unmet.stop_sequence) == ("end_turn", None)


async def test_earlier_turns_reach_the_template_in_order(
    plain: httpx2.AsyncClient, fake: FakeBackend
) -> None:
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "My name is Ada."}]},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"},
    ]
    await claude(plain).messages.create(model="fake-chat", max_tokens=16, messages=turns)
    prompt = fake.calls[-1].prompt
    assert prompt.index("My name is Ada.") < prompt.index("Hello Ada.") < prompt.index("my name?")


async def test_a_stream_sends_anthropics_events_and_the_sdk_assembles_the_message(
    plain: httpx2.AsyncClient,
) -> None:
    async with claude(plain).messages.stream(
        model="fake-chat", max_tokens=64, messages=HI
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert kinds.count("text") == len(REPLY.split())  # one text delta a word
    assert final.content[0].text == REPLY  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(REPLY.split())


async def test_a_tool_round_trip(plain: httpx2.AsyncClient, fake: FakeBackend) -> None:
    client = claude(plain)
    fake.reply = CALL
    asked = await client.messages.create(
        model="fake-chat", max_tokens=64, messages=HI, tools=[CLAUDE_WEATHER]
    )
    assert asked.stop_reason == "tool_use"
    (use,) = [block for block in asked.content if block.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    fake.reply = "It is sunny in Paris."
    turns: list[Any] = [
        *HI,
        {"role": "assistant", "content": [block.model_dump() for block in asked.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
        },
    ]
    answer = await client.messages.create(
        model="fake-chat", max_tokens=64, messages=turns, tools=[CLAUDE_WEATHER]
    )
    assert answer.content[0].text == "It is sunny in Paris."  # type: ignore[union-attr]
    prompt = fake.calls[-1].prompt
    assert "get_weather" in prompt and "sunny" in prompt


async def test_a_streamed_tool_call_comes_as_input_json(
    plain: httpx2.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = CALL
    async with claude(plain).messages.stream(
        model="fake-chat", max_tokens=64, messages=HI, tools=[CLAUDE_WEATHER]
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert "input_json" in kinds
    (use,) = final.content
    assert use.type == "tool_use" and use.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


async def test_tool_choice_any_forces_a_call_and_none_offers_no_tool(
    plain: httpx2.AsyncClient, fake: FakeBackend
) -> None:
    client = claude(plain)
    fake.reply = CALL
    forced = await client.messages.create(
        model="fake-chat",
        max_tokens=64,
        messages=HI,
        tools=[CLAUDE_WEATHER],
        tool_choice={"type": "any"},
    )
    assert forced.stop_reason == "tool_use"
    fake.reply = REPLY
    await client.messages.create(
        model="fake-chat",
        max_tokens=64,
        messages=HI,
        tools=[CLAUDE_WEATHER],
        tool_choice={"type": "none"},
    )
    assert "get_weather" not in fake.calls[-1].prompt


async def test_thinking_shows_a_reasoning_models_reasoning_first(
    plain: httpx2.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = "<think>Two and two make four.</think>Four."
    client = claude(plain)
    thought = await client.messages.create(
        model="fake-reasoner",
        max_tokens=64,
        messages=HI,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert [block.type for block in thought.content] == ["thinking", "text"]
    assert thought.content[0].thinking == "Two and two make four."  # type: ignore[union-attr]
    assert thought.content[1].text == "Four."  # type: ignore[union-attr]
    plain_answer = await client.messages.create(model="fake-reasoner", max_tokens=64, messages=HI)
    assert [block.type for block in plain_answer.content] == ["text"]
    async with client.messages.stream(
        model="fake-reasoner",
        max_tokens=64,
        messages=HI,
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert "thinking" in kinds
    assert [block.type for block in final.content] == ["thinking", "text"]


async def test_count_tokens_counts_the_prompt_without_generating(
    plain: httpx2.AsyncClient, fake: FakeBackend
) -> None:
    generated = len(fake.calls)
    counted = await claude(plain).messages.count_tokens(model="fake-chat", messages=HI)
    assert counted.input_tokens > 0
    assert len(fake.calls) == generated
    more = await claude(plain).messages.count_tokens(
        model="fake-chat", messages=HI, system="A much longer system prompt than none at all."
    )
    assert more.input_tokens > counted.input_tokens


async def test_errors_have_anthropics_shape(plain: httpx2.AsyncClient) -> None:
    client = claude(plain)
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(model="no-such-model", max_tokens=8, messages=HI)
    assert missing.value.body["type"] == "error"  # type: ignore[index]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError) as unknown:
        await claude(plain, "sk-gw-not-a-key").messages.create(
            model="fake-chat", max_tokens=8, messages=HI
        )
    assert unknown.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    answer = await plain.post(
        "/v1/messages",
        json={"model": "fake-chat", "messages": HI},
        headers={"x-api-key": ADMIN_KEY},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in answer.json()["error"]["message"]


async def test_a_keys_model_allow_list_applies(
    http: httpx.AsyncClient, plain: httpx2.AsyncClient
) -> None:
    key = await new_key(http, models=["fake-plain"])
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        await claude(plain, key["key"]).messages.create(
            model="fake-chat", max_tokens=8, messages=HI
        )
    assert refused.value.body["error"]["type"] == "permission_error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"container": "cont_1"}, "container"),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "text", "data": "x"}}],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
    ],
)
async def test_what_the_gateway_cannot_do_is_refused_by_name(
    plain: httpx2.AsyncClient, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "fake-chat", "max_tokens": 8, "messages": HI, **extra}
    answer = await plain.post("/v1/messages", json=body, headers={"x-api-key": ADMIN_KEY})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith(param), answer.text


async def test_an_anthropic_client_lists_the_chat_models_in_its_shape(
    plain: httpx2.AsyncClient, http: httpx.AsyncClient
) -> None:
    client = claude(plain)
    listed = [model.id async for model in client.models.list()]
    assert "fake-chat" in listed and "fake-embed" not in listed
    one = await client.models.retrieve("fake-chat")
    assert (one.type, one.id, one.display_name) == ("model", "fake-chat", "fake-chat")
    openai_shape = (await http.get("/v1/models")).json()
    assert openai_shape["object"] == "list"
    assert any(model["id"] == "fake-embed" for model in openai_shape["data"])


async def test_a_large_body_with_x_api_key_is_read_and_refusals_before_it_keep_the_shape(
    plain: httpx2.AsyncClient,
) -> None:
    big = {"model": "fake-chat", "max_tokens": 8, "messages": HI, "system": "x " * 700_000}
    # Over the size whose key is checked before the body is read: x-api-key is that key.
    read = await plain.post("/v1/messages", json=big, headers={"x-api-key": ADMIN_KEY})
    assert read.status_code == 400, read.text
    assert read.json()["error"]["type"] == "invalid_request_error"
    assert "context" in read.json()["error"]["message"]
    unread = await plain.post("/v1/messages", json=big, headers={"x-api-key": "sk-gw-wrong"})
    assert unread.status_code == 401
    assert unread.json()["type"] == "error"
    assert unread.json()["error"]["type"] == "authentication_error"
    deep = '{"model": "fake-chat", "max_tokens": 8, "messages": ' + "[" * 200 + "]" * 200 + "}"
    refused = await plain.post(
        "/v1/messages",
        content=deep,
        headers={"x-api-key": ADMIN_KEY, "content-type": "application/json"},
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"


async def test_a_tools_anthropic_only_fields_are_accepted(plain: httpx2.AsyncClient) -> None:
    tool = {
        **CLAUDE_WEATHER,
        "type": "custom",
        "eager_input_streaming": True,
        "cache_control": {"type": "ephemeral"},
    }
    message = await claude(plain).messages.create(
        model="fake-chat", max_tokens=8, messages=HI, tools=[tool]
    )
    assert message.content[0].type == "text"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_strict_tools_arguments_that_break_its_schema_are_generated_again(
    plain: httpx2.AsyncClient, fake: FakeBackend, stream: bool
) -> None:
    fake.replies = [
        '<tool_call> {"name": "get_weather", "arguments": {"town": 5}} </tool_call>',
        '{"city": "Lyon"}',
    ]
    strict = {**CLAUDE_WEATHER, "strict": True}
    client = claude(plain)
    if stream:
        async with client.messages.stream(
            model="fake-chat", max_tokens=64, messages=HI, tools=[strict]
        ) as events:
            partial = [e.partial_json async for e in events if e.type == "input_json"]
            message = await events.get_final_message()
        assert partial == ['{"city": "Lyon"}']  # held back until checked
    else:
        message = await client.messages.create(
            model="fake-chat", max_tokens=64, messages=HI, tools=[strict]
        )
    (use,) = message.content
    assert use.type == "tool_use" and use.input == {"city": "Lyon"}
    assert len(fake.calls) == 2


async def test_thinking_is_signed_and_only_this_gateways_unchanged_signature_comes_back(
    plain: httpx2.AsyncClient, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = "<think>Two and two make four.</think>Four."
    client = claude(plain)
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    first = await client.messages.create(
        model="fake-reasoner", max_tokens=64, messages=HI, thinking=thinking
    )
    block = first.content[0]
    assert block.type == "thinking" and block.signature  # sealed, not readable
    assert "Two and two" not in block.signature

    def turns(thought: dict[str, Any]) -> list[Any]:
        answer = {"role": "assistant", "content": [thought, {"type": "text", "text": "Four."}]}
        return [*HI, answer, {"role": "user", "content": "And three?"}]

    sent = block.model_dump()
    again = await client.messages.create(
        model="fake-reasoner", max_tokens=64, messages=turns(sent), thinking=thinking
    )
    assert again.stop_reason == "end_turn"
    for changed, where in [
        ({**sent, "thinking": "Two and two make five."}, "thinking"),
        ({**sent, "signature": sent["signature"][:-4] + "AAAA"}, "signature"),
    ]:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model="fake-reasoner", max_tokens=64, messages=turns(changed), thinking=thinking
            )
        assert refused.value.body["error"]["message"].startswith(  # type: ignore[index]
            f"messages[1].content[0].{where}"
        )
    other = (await new_key(http))["key"]  # a signature is bound to the key it was made for
    with pytest.raises(anthropic.BadRequestError):
        await claude(plain, other).messages.create(
            model="fake-reasoner", max_tokens=64, messages=turns(sent), thinking=thinking
        )


async def test_omitted_thinking_sends_the_signature_alone_whole_and_streamed(
    plain: httpx2.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = "<think>Two and two make four.</think>Four."
    client = claude(plain)
    thinking: Any = {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}
    whole = await client.messages.create(
        model="fake-reasoner", max_tokens=64, messages=HI, thinking=thinking
    )
    (block, text) = whole.content
    assert block.type == "thinking" and block.thinking == "" and block.signature
    assert text.type == "text" and text.text == "Four."
    async with client.messages.stream(
        model="fake-reasoner", max_tokens=64, messages=HI, thinking=thinking
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert "thinking" not in kinds and "signature" in kinds
    assert final.content[0].thinking == "" and final.content[0].signature  # type: ignore[union-attr]
