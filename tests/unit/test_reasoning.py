"""Reasoning models: the parsers, and chat through the official SDK against the fake
backend's ``fake-reasoner`` (a Qwen3-style template, ``reasoning_parser: qwen3``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.backend.fake import FakeBackend
from gateway.serving.reasoning_parsers import ReasoningTokens, get_parser, parser_names, split
from tests.support.bodies import USER_HI, assert_openai_error, chat_body, sse_json
from tests.support.shapes import CALL, WEATHER, City

THOUGHT = "<think> I weigh it. </think> The answer."


# -- the parsers ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize(
    ("prompt", "text", "reasoning", "content"),
    [
        # DeepSeek-R1's template opens the reasoning in the prompt: the model never does.
        ("<｜Assistant｜><think>\n", "Let me see.\n</think>\n\nParis.", "Let me see.", "Paris."),
        ("assistant\n", "<think>\nLet me see.</think>Paris.", "Let me see.", "Paris."),
        # Cut by max_tokens while thinking: all reasoning.
        ("assistant\n", "<think>\nStill thinking", "Still thinking", None),
        # Thinking switched off by the template (an empty reasoning closed in the prompt).
        ("assistant\n<think>\n\n</think>\n\n", "Paris.", None, "Paris."),
        # A second block, or a marker in the answer, is the answer's.
        ("", "a</think>b<think>c</think>", "a", "b<think>c</think>"),
    ],
)
def test_think_tags_split_reasoning_from_the_answer(
    name: str, prompt: str, text: str, reasoning: str | None, content: str | None
) -> None:
    parser = get_parser(name)
    assert parser is not None
    assert split(parser(prompt), text) == (reasoning, content)


def test_a_streamed_reply_splits_as_the_whole_one_wherever_it_is_cut() -> None:
    text = '<think>\nThe user wants JSON. </think>\n\n{"a": 1}'
    parser = get_parser("deepseek_r1")
    assert parser is not None
    for first in range(len(text)):
        for second in range(first, len(text), 3):
            p = parser("x")
            told = [p.feed(text[:first]), p.feed(text[first:second]), p.feed(text[second:])]
            told.append(p.finish())
            assert "".join(d.reasoning for d in told) == "The user wants JSON.", (first, second)
            assert "".join(d.content for d in told) == '{"a": 1}', (first, second)
            # Where the answer starts in the text: where strict arguments start again.
            assert text[p.content_at :] == '{"a": 1}'


def test_reasoning_tokens_count_the_pieces_before_the_answer() -> None:
    parser = get_parser("qwen3")
    assert parser is not None and parser_names() == ["deepseek_r1", "qwen3"]
    by_token = ReasoningTokens()
    p = parser("x")
    for piece in ["<think>", "Hmm", ".", "</think>", "Yes", "."]:
        by_token.add(p, piece, 1)
    assert by_token.count == 4
    # One piece holding both: split where the answer starts (16 of 20 characters).
    whole = ReasoningTokens()
    whole.add(parser("x"), "<think>Hmm.</think>Yes.", 10)
    assert whole.count == 8


# -- chat ----------------------------------------------------------------------------------


async def test_reasoning_comes_apart_from_the_answer(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = THOUGHT
    reply = await client.chat.completions.create(model="fake-reasoner", messages=USER_HI)
    message = reply.choices[0].message
    assert message.content == "The answer."
    extra = message.model_extra or {}
    assert extra["reasoning_content"] == extra["reasoning"] == "I weigh it."
    assert reply.usage is not None and reply.usage.completion_tokens == 7
    details = reply.usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens == 5  # "<think>" .. "</think>"


async def test_other_models_send_no_reasoning_fields(http: httpx.AsyncClient) -> None:
    body = (await http.post("/v1/chat/completions", json=chat_body())).json()
    assert "reasoning_content" not in body["choices"][0]["message"]
    assert "completion_tokens_details" not in body["usage"]


async def test_streamed_reasoning_comes_as_reasoning_deltas(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = THOUGHT
    body = chat_body(model="fake-reasoner", stream=True, stream_options={"include_usage": True})
    events = sse_json((await http.post("/v1/chat/completions", json=body)).text)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert reasoning == "".join(d.get("reasoning", "") for d in deltas) == "I weigh it."
    assert "".join(d.get("content") or "" for d in deltas) == "The answer."
    # Every reasoning delta comes before the answer's first.
    told = [d for d in deltas if d.get("reasoning_content") or d.get("content")]
    kinds = ["r" if d.get("reasoning_content") else "c" for d in told]
    assert kinds == sorted(kinds, reverse=True), kinds
    usage = events[-1]["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 5}


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_are_read_from_the_answer_only(
    client: openai.AsyncOpenAI, fake: FakeBackend, stream: bool
) -> None:
    """A call the model only thinks about is reasoning, not a call."""
    fake.reply = f'<think> Maybe <tool_call> {{"name": "get_weather", }} </think> {CALL}'
    if stream:
        async with client.chat.completions.stream(
            model="fake-reasoner", messages=USER_HI, tools=[WEATHER]
        ) as events:
            reply = await events.get_final_completion()
    else:
        reply = await client.chat.completions.create(
            model="fake-reasoner", messages=USER_HI, tools=[WEATHER]
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content
    assert "<tool_call>" in (choice.message.model_extra or {})["reasoning_content"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_json_answer_is_constrained_only_after_the_reasoning(
    client: openai.AsyncOpenAI, fake: FakeBackend, stream: bool
) -> None:
    """Triton's engines enforce a constraint from the first token: the reasoning is
    generated first without it, up to ``</think>``, then the answer under it."""
    fake.replies = [
        "<think> Paris is large. </think> never sent",
        '{"name": "Paris", "population": 2}',
    ]
    kwargs: dict[str, Any] = {"model": "fake-reasoner", "messages": USER_HI, "max_tokens": 50}
    if stream:
        async with client.chat.completions.stream(
            **kwargs, response_format=City, stream_options={"include_usage": True}
        ) as events:
            reply = await events.get_final_completion()
    else:
        reply = await client.chat.completions.parse(**kwargs, response_format=City)
    message = reply.choices[0].message
    assert message.parsed == City(name="Paris", population=2)
    assert (message.model_extra or {})["reasoning_content"] == "Paris is large."
    thinking, answer = fake.calls[-2:]
    assert thinking.options.constraint is None and thinking.options.stop == ["</think>"]
    assert answer.options.constraint is not None
    assert answer.prompt == thinking.prompt + "<think> Paris is large. </think>"
    assert answer.options.max_tokens == 50 - thinking.tokens_sent  # what the reasoning left
    assert reply.usage is not None
    assert reply.usage.completion_tokens == thinking.tokens_sent + answer.tokens_sent
    details = reply.usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens == thinking.tokens_sent
    assert reply.usage.prompt_tokens == len(thinking.prompt.split())  # counted once


async def test_reasoning_that_uses_every_token_leaves_none_for_the_answer(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = "<think> a b c d e f </think> x"
    reply = await client.chat.completions.create(
        model="fake-reasoner",
        messages=USER_HI,
        max_tokens=3,
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content is None
    assert len(fake.calls) == 1


async def test_a_model_without_reasoning_has_its_constraint_from_the_start(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    body = chat_body(response_format={"type": "json_object"})
    assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
    assert len(fake.calls) == 1 and fake.calls[0].options.constraint is not None


@pytest.mark.parametrize(
    "fields",
    [{"reasoning_effort": "none"}, {"chat_template_kwargs": {"enable_thinking": False}}],
)
async def test_thinking_switched_off_through_the_template(
    client: openai.AsyncOpenAI, fake: FakeBackend, fields: dict[str, Any]
) -> None:
    fake.reply = "Paris."
    reply = await client.chat.completions.create(
        model="fake-reasoner", messages=USER_HI, extra_body=fields
    )
    assert fake.calls[-1].prompt.endswith("<think>\n\n</think>\n\n")
    assert reply.choices[0].message.content == "Paris."
    assert "reasoning_content" not in (reply.choices[0].message.model_extra or {})


async def test_an_effort_above_none_leaves_thinking_on(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = THOUGHT
    reply = await client.chat.completions.create(
        model="fake-reasoner", messages=USER_HI, reasoning_effort="high"
    )
    assert not fake.calls[-1].prompt.endswith("</think>\n\n")
    assert (reply.choices[0].message.model_extra or {})["reasoning_content"] == "I weigh it."


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        # fake-chat's template has no reasoning switch.
        ({"model": "fake-chat", "reasoning_effort": "low"}, "reasoning_effort"),
        ({"model": "fake-reasoner", "reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"model": "fake-reasoner", "chat_template_kwargs": {"thinking": True}}, None),
        ({"model": "fake-reasoner", "chat_template_kwargs": {"tools": []}}, None),
        (
            {
                "model": "fake-reasoner",
                "reasoning_effort": "high",
                "chat_template_kwargs": {"enable_thinking": False},
            },
            "reasoning_effort",
        ),
    ],
)
async def test_template_switches_it_cannot_set_are_refused_by_name(
    http: httpx.AsyncClient, fake: FakeBackend, fields: dict[str, Any], param: str | None
) -> None:
    response = await http.post("/v1/chat/completions", json=chat_body(**fields))
    expected = param or f"chat_template_kwargs.{next(iter(fields['chat_template_kwargs']))}"
    if param == "reasoning_effort" and fields.get("reasoning_effort") == "extreme":
        assert_openai_error(response, 400)  # not one of OpenAI's values
    else:
        assert_openai_error(response, 400, param=expected)
    assert not fake.calls


async def test_an_answer_sent_back_whole_with_its_reasoning_is_taken(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    """SDK users append ``choices[0].message`` to the conversation: its reasoning fields come
    back with it."""
    fake.reply = THOUGHT
    first = await client.chat.completions.create(model="fake-reasoner", messages=USER_HI)
    messages: list[Any] = [*USER_HI, first.choices[0].message, {"role": "user", "content": "And?"}]
    again = await client.chat.completions.create(model="fake-reasoner", messages=messages)
    assert again.choices[0].message.content == "The answer."


async def test_reasoning_tokens_add_up_over_choices(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = THOUGHT
    body = (
        await http.post("/v1/chat/completions", json=chat_body(model="fake-reasoner", n=3))
    ).json()
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 15}
    assert [c["message"]["reasoning_content"] for c in body["choices"]] == ["I weigh it."] * 3


# -- Responses -----------------------------------------------------------------------------


async def test_responses_give_the_reasoning_as_a_reasoning_item(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = THOUGHT
    response = await client.responses.create(model="fake-reasoner", input="Hi")
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [(p.type, p.text) for p in reasoning.content or []] == [
        ("reasoning_text", "I weigh it.")
    ]
    assert message.type == "message" and response.output_text == "The answer."
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == 5
    # Sent back as input, the reasoning item is taken with the answer it came with.
    again = await client.responses.create(
        model="fake-reasoner",
        input=[
            {"role": "user", "content": "Hi"},
            *[item.model_dump(exclude_none=True) for item in response.output],
            {"role": "user", "content": "And?"},
        ],
    )
    assert again.status == "completed"


async def test_streamed_responses_send_reasoning_text_events(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = f"<think> I weigh it. </think> {CALL}"
    async with client.responses.stream(
        model="fake-reasoner",
        input="Hi",
        tools=[{"type": "function", **WEATHER["function"]}],  # type: ignore[list-item]
    ) as stream:
        kinds = [event.type async for event in stream]
        response = await stream.get_final_response()
    assert kinds.index("response.reasoning_text.done") < kinds.index(
        "response.function_call_arguments.done"
    )
    deltas = [k for k in kinds if k == "response.reasoning_text.delta"]
    assert len(deltas) == 3  # "I", " weigh", " it." (whitespace around it held back)
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "I weigh it."
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == 5


async def test_responses_reasoning_effort_reaches_the_template(
    client: openai.AsyncOpenAI, fake: FakeBackend, http: httpx.AsyncClient
) -> None:
    fake.reply = "Paris."
    response = await client.responses.create(
        model="fake-reasoner", input="Hi", reasoning={"effort": "none"}
    )
    assert fake.calls[-1].prompt.endswith("</think>\n\n")
    assert [item.type for item in response.output] == ["message"]
    assert response.reasoning is not None and response.reasoning.effort == "none"
    # A model without a reasoning switch takes "none" (it does not reason) but no other.
    body = {"model": "fake-chat", "input": "Hi", "reasoning": {"effort": "none"}}
    assert (await http.post("/v1/responses", json=body)).status_code == 200
    body["reasoning"] = {"effort": "low"}
    assert_openai_error(await http.post("/v1/responses", json=body), 400, param="reasoning.effort")


async def test_a_spoken_answer_says_the_answer_not_the_reasoning(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = THOUGHT
    body = chat_body(
        model="fake-reasoner",
        stream=True,
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        stream_options={"include_usage": True},
    )
    events = sse_json((await http.post("/v1/chat/completions", json=body)).text)
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    assert "".join(d.get("audio", {}).get("transcript", "") for d in deltas) == "The answer."
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_session_keeps_the_answer_without_its_reasoning(
    http: httpx.AsyncClient, fake: FakeBackend, stream: bool
) -> None:
    fake.reply = THOUGHT
    body = chat_body(model="fake-reasoner", stream=stream)
    headers = {"X-Session-ID": f"think-{stream}"}
    assert (await http.post("/v1/chat/completions", json=body, headers=headers)).is_success
    stored = (await http.get(f"/v1/sessions/think-{stream}")).json()["messages"]
    assert stored[-1] == {"role": "assistant", "content": "The answer."}


async def test_min_tokens_counts_over_the_reasoning_and_the_answer(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    """An engine honouring min_tokens ignores stop strings until then: the reasoning step
    gets none, the answer what is left of it, within what is left of max_tokens."""
    fake.replies = ["<think> a b c </think>", '{"answer": 1}']
    await client.chat.completions.create(
        model="fake-reasoner",
        messages=USER_HI,
        max_tokens=40,
        response_format={"type": "json_object"},
        extra_body={"min_tokens": 35},
    )
    thinking, answer = fake.calls[-2:]
    assert thinking.options.min_tokens is None
    left = 40 - thinking.tokens_sent
    assert answer.options.max_tokens == left
    assert answer.options.min_tokens == min(35 - thinking.tokens_sent, left)


def test_a_long_run_of_blank_lines_costs_time_in_its_own_length() -> None:
    parser = get_parser("qwen3")
    assert parser is not None
    p = parser("x")
    fed = [p.feed("\n") for _ in range(50_000)]
    assert not any(d.reasoning or d.content for d in fed)
    told = p.feed("then</think>ok")
    assert (told.reasoning, told.content) == ("then", "ok")
    assert len(p._space) == 0  # the whitespace before "then" went out with it


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"enable_thinking": "false"}, "chat_template_kwargs.enable_thinking"),  # a truthy string
        ({"enable_thinking": 0}, "chat_template_kwargs.enable_thinking"),
        ({"enable_thinking": True, "x": [[[[[[[[[1]]]]]]]]]}, "chat_template_kwargs"),
        ({"enable_thinking": "x" * 20_000}, "chat_template_kwargs"),
    ],
)
async def test_template_switch_values_are_checked(
    http: httpx.AsyncClient, fake: FakeBackend, kwargs: dict[str, Any], param: str
) -> None:
    body = chat_body(model="fake-reasoner", chat_template_kwargs=kwargs)
    assert_openai_error(await http.post("/v1/chat/completions", json=body), 400, param=param)
    assert not fake.calls


async def test_two_different_reasonings_on_one_message_are_refused(
    http: httpx.AsyncClient,
) -> None:
    answer = {"role": "assistant", "content": "A.", "reasoning": "x", "reasoning_content": "y"}
    body = chat_body(model="fake-reasoner", messages=[*USER_HI, answer, *USER_HI])
    response = await http.post("/v1/chat/completions", json=body)
    assert_openai_error(response, 400, param="messages.[1].reasoning")


async def test_an_unknown_model_is_a_404_before_any_audio_is_heard(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    body = chat_body(model="no-such-model", messages=[{"role": "user", "content": [audio]}])
    assert_openai_error(await http.post("/v1/chat/completions", json=body), 404)
    assert not fake.transcribe_calls
