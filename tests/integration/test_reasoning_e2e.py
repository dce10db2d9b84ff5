"""Reasoning models end to end: ``mock_r1`` (DeepSeek-R1's template opens ``<think>`` in the
prompt, ``reasoning_parser: deepseek_r1``) and ``mock_qwen3`` (Qwen3's ``enable_thinking``
switch and Hermes tools, ``reasoning_parser: qwen3``) loaded through the admin API into the
real Triton and called with the official SDK. Both write ``<think>`` reasoning and then an
answer, one whitespace-separated word per token; under a structured-output constraint they
write JSON from the first token, as the Triton vLLM backend's grammar makes a model do
(triton_repo/mock_words.py)."""

from __future__ import annotations

import json
import urllib.parse

import httpx
import openai
import pytest

from tests.support.shapes import WEATHER, City
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

ANSWER = "The quick brown fox jumps over the lazy dog."
THOUGHT = "Paris is the capital of France."


def ask(thought: str = THOUGHT, say: str | None = None) -> list[dict[str, str]]:
    """A user message that makes the models think ``thought`` (and answer ``say``)."""
    text = f"Where? [mock:think={urllib.parse.quote(thought)}]"
    if say is not None:
        text += f" [mock:say={urllib.parse.quote(say)}]"
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def sdk(stack: GatewayProcess) -> openai.OpenAI:
    with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=120) as http:
        for name in ("mock_r1", "mock_qwen3"):
            answer = http.post(f"/admin/models/{name}/load")
            assert answer.status_code == 200, answer.text
    return stack.client()


def test_models_say_which_parser_reads_their_reasoning(sdk: openai.OpenAI) -> None:
    models = {m.id: m.model_extra or {} for m in sdk.models.list()}
    assert models["mock_r1"]["capabilities"]["reasoning"] == "deepseek_r1"
    assert models["mock_qwen3"]["capabilities"]["reasoning"] == "qwen3"
    assert models["mock_chat"]["capabilities"]["reasoning"] is None


@pytest.mark.parametrize("model", ["mock_r1", "mock_qwen3"])
def test_reasoning_comes_apart_from_the_answer(sdk: openai.OpenAI, model: str) -> None:
    reply = sdk.chat.completions.create(model=model, messages=ask())
    message = reply.choices[0].message
    assert message.content == ANSWER
    extra = message.model_extra or {}
    assert extra["reasoning_content"] == extra["reasoning"] == THOUGHT
    # One token a word: the thought and </think> (and Qwen3's own <think>; R1's is in the
    # prompt), then the nine words of the answer.
    reasoning = len(THOUGHT.split()) + (1 if model == "mock_r1" else 2)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == reasoning + 9
    details = reply.usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens == reasoning


def test_streamed_reasoning_comes_before_the_answer(sdk: openai.OpenAI) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model="mock_qwen3",
            messages=ask(),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [(d.model_extra or {}).get("reasoning_content") for d in deltas]
    assert "".join(r for r in reasoning if r) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == ANSWER
    last_thought = max(i for i, r in enumerate(reasoning) if r)
    first_word = min(i for i, d in enumerate(deltas) if d.content)
    assert last_thought < first_word
    assert len([r for r in reasoning if r]) > 3  # streamed, not sent at the end
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == len(THOUGHT.split()) + 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_thought_about_is_not_a_call(sdk: openai.OpenAI, stream: bool) -> None:
    """The tool parser reads the answer only: a <tool_call> in the reasoning stays there."""
    call = '<tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}} </tool_call>'
    thought = 'I could write <tool_call> {"name": "get_weather"} but first I check.'
    messages = ask(thought, say=call)
    if stream:
        with sdk.chat.completions.stream(
            model="mock_qwen3", messages=messages, tools=[WEATHER]
        ) as events:
            reply = events.get_final_completion()
    else:
        reply = sdk.chat.completions.create(model="mock_qwen3", messages=messages, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [made] = choice.message.tool_calls or []
    assert (made.function.name, json.loads(made.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert (choice.message.model_extra or {})["reasoning_content"] == thought


@pytest.mark.parametrize("model", ["mock_r1", "mock_qwen3"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_json_answer_comes_after_the_reasoning(
    sdk: openai.OpenAI, model: str, stream: bool
) -> None:
    """Constrained from its first token, the model could not reason (the peer's failure:
    the JSON swallowed by the reasoning); the gateway lets it reason, then constrains the
    answer."""
    if stream:
        with sdk.chat.completions.stream(
            model=model, messages=ask(), response_format=City
        ) as events:
            reply = events.get_final_completion()
    else:
        reply = sdk.chat.completions.parse(model=model, messages=ask(), response_format=City)
    message = reply.choices[0].message
    assert isinstance(message.parsed, City)
    assert (message.model_extra or {})["reasoning_content"] == THOUGHT


def test_thinking_switched_off_through_reasoning_effort(sdk: openai.OpenAI) -> None:
    reply = sdk.chat.completions.create(model="mock_qwen3", messages=ask(), reasoning_effort="none")
    assert reply.choices[0].message.content == ANSWER
    assert "reasoning_content" not in (reply.choices[0].message.model_extra or {})
    same = sdk.chat.completions.create(
        model="mock_qwen3",
        messages=ask(),
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert same.choices[0].message.content == ANSWER


def test_an_effort_the_template_cannot_take_is_refused(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="mock_r1", messages=ask(), reasoning_effort="low")
    assert refused.value.body["param"] == "reasoning_effort"  # type: ignore[index]


def test_responses_stream_the_reasoning_as_a_reasoning_item(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(model="mock_qwen3", input=ask()) as stream:
        kinds = [event.type for event in stream]
        response = stream.get_final_response()
    assert kinds.count("response.reasoning_text.delta") > 3
    reasoning, message = response.output
    assert message.type == "message"
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == THOUGHT
    assert response.output_text == ANSWER
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == len(THOUGHT.split()) + 2
