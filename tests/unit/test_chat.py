"""Non-streaming chat completions through the official SDK, and what reaches the backend."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from gateway.backend import ModelInfo, SamplingOptions
from gateway.backend.fake import FakeBackend
from gateway.config import CHATML_TEMPLATE
from tests.support.bodies import USER_HI, chat_body
from tests.support.inprocess import REPLY

CHATML_HI = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


async def test_reply_finish_reason_and_usage(client: openai.AsyncOpenAI, fake: FakeBackend) -> None:
    completion = await client.chat.completions.create(model="fake-chat", messages=USER_HI)

    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "fake-chat"
    assert len(completion.choices) == 1
    choice = completion.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == REPLY
    assert choice.finish_reason == "stop"

    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens == len(REPLY.split())
    assert usage.prompt_tokens == len(fake.calls[-1].prompt.split()) > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    assert len(fake.calls) == 1
    assert fake.calls[-1].model == "fake-chat"
    assert fake.calls[-1].stream is False


async def test_each_completion_has_its_own_id(client: openai.AsyncOpenAI) -> None:
    first = await client.chat.completions.create(model="fake-chat", messages=USER_HI)
    second = await client.chat.completions.create(model="fake-chat", messages=USER_HI)
    assert first.id != second.id


async def test_max_tokens_cuts_the_reply_with_finish_length(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    completion = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, max_tokens=2
    )
    assert completion.choices[0].message.content == "Hello from"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 2
    assert fake.calls[-1].options.max_tokens == 2


async def test_max_completion_tokens_is_honoured(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    completion = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, max_completion_tokens=3
    )
    assert completion.choices[0].message.content == "Hello from the"
    assert completion.choices[0].finish_reason == "length"
    assert fake.calls[-1].options.max_tokens == 3


async def test_max_completion_tokens_wins_over_max_tokens(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    completion = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, max_tokens=1, max_completion_tokens=3
    )
    assert completion.choices[0].message.content == "Hello from the"
    assert fake.calls[-1].options.max_tokens == 3


@pytest.mark.parametrize(
    ("stop", "expected"),
    [("fake", "Hello from the "), (["zzz", "the"], "Hello from ")],
)
async def test_stop_sequence_cuts_the_text(
    client: openai.AsyncOpenAI, fake: FakeBackend, stop: str | list[str], expected: str
) -> None:
    completion = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, stop=stop
    )
    assert completion.choices[0].message.content == expected
    assert completion.choices[0].finish_reason == "stop"
    assert fake.calls[-1].options.stop == ([stop] if isinstance(stop, str) else stop)


async def test_sampling_parameters_reach_the_backend(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    await client.chat.completions.create(
        model="fake-chat",
        messages=USER_HI,
        temperature=0.5,
        top_p=0.9,
        seed=7,
        presence_penalty=0.25,
        frequency_penalty=-0.5,
        stop=["END"],
        max_tokens=40,
    )
    assert fake.calls[-1].options == SamplingOptions(
        max_tokens=40,
        temperature=0.5,
        top_p=0.9,
        seed=7,
        stop=["END"],
        presence_penalty=0.25,
        frequency_penalty=-0.5,
    )


async def test_unset_parameters_leave_the_model_defaults_but_max_tokens(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    """An engine's own max_tokens default is tiny (vLLM: 16 tokens), so the gateway always
    sends one: without the client's, what fits the context after the prompt."""
    await client.chat.completions.create(model="fake-chat", messages=USER_HI)
    sent = fake.calls[-1]
    prompt_estimate = -(-len(sent.prompt.encode()) // 4)
    assert sent.options == SamplingOptions(max_tokens=2048 - prompt_estimate)


async def test_temperature_zero_is_passed_not_dropped(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    await client.chat.completions.create(model="fake-chat", messages=USER_HI, temperature=0, seed=0)
    assert fake.calls[-1].options.temperature == 0.0
    assert fake.calls[-1].options.seed == 0


async def test_top_p_zero_becomes_greedy_decoding(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, top_p=0, temperature=0.8
    )
    options = fake.calls[-1].options
    assert options.temperature == 0.0
    assert options.top_p is None


async def test_prompt_is_the_chatml_rendering_of_the_messages(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    await client.chat.completions.create(
        model="fake-chat",
        messages=[
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Line one"}, {"type": "text", "text": "two"}],
            },
            {"role": "assistant", "content": "Sure."},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "Go"},
        ],
    )
    assert fake.calls[-1].prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nLine one\ntwo<|im_end|>\n"
        "<|im_start|>assistant\nSure.<|im_end|>\n"
        "<|im_start|>system\nAnswer in French.<|im_end|>\n"
        "<|im_start|>user\nGo<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


async def test_single_user_message_prompt(client: openai.AsyncOpenAI, fake: FakeBackend) -> None:
    await client.chat.completions.create(model="fake-chat", messages=USER_HI)
    assert fake.calls[-1].prompt == CHATML_HI


async def test_fields_the_gateway_honours_are_accepted(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # store=false stores nothing; user and tool_choice none are honoured.
    response = await http.post(
        "/v1/chat/completions", json=chat_body(store=False, user="u1", tool_choice="none")
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == REPLY


@pytest.mark.parametrize(
    "field",
    [{"reasoning_effort": "low"}, {"top_a": 5}],
)
async def test_fields_it_cannot_honour_are_refused_by_name(
    http: httpx.AsyncClient, fake: FakeBackend, field: dict[str, Any]
) -> None:
    """Never a silent drop: an OpenAI field the gateway does not implement, or one it does
    not know, is a 400 naming it."""
    response = await http.post("/v1/chat/completions", json=chat_body(**field))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == next(iter(field))
    assert not fake.calls


async def test_response_format_text_is_accepted(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/v1/chat/completions", json=chat_body(response_format={"type": "text"}, n=1)
    )
    assert response.status_code == 200, response.text


def limited_model(fake: FakeBackend, template: str | None = CHATML_TEMPLATE) -> None:
    """A model whose config takes only stop strings, and whose operator accepts a
    temperature it does not honour (``openai_ignore: temperature``)."""
    fake.model_list.append(
        ModelInfo(
            "fake-custom",
            "chat",
            True,
            template,
            2048,
            takes=frozenset({"stop"}),
            ignores=frozenset({"temperature"}),
        )
    )


@pytest.mark.parametrize(
    ("sent", "param"),
    [
        ({"top_p": 0.5}, "top_p"),
        ({"seed": 1}, "seed"),
        ({"max_completion_tokens": 5}, "max_completion_tokens"),
        ({"max_tokens": 5}, "max_tokens"),
    ],
)
async def test_a_parameter_the_model_cannot_take_is_refused_by_name(
    client: openai.AsyncOpenAI, fake: FakeBackend, sent: dict[str, Any], param: str
) -> None:
    limited_model(fake)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model="fake-custom", messages=USER_HI, **sent)
    assert refused.value.body["param"] == param  # type: ignore[index]
    assert refused.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    assert not fake.calls


async def test_an_ignored_parameter_is_accepted_and_not_sent(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    limited_model(fake)
    reply = await client.chat.completions.create(
        model="fake-custom", messages=USER_HI, temperature=0.2, stop=["zzz"]
    )
    assert reply.choices[0].message.content == REPLY
    # Neither the ignored temperature nor a max_tokens the model has no input for.
    assert fake.calls[-1].options == SamplingOptions(stop=["zzz"])


async def test_a_chat_model_without_a_template_is_refused_but_completes(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    limited_model(fake, template=None)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model="fake-custom", messages=USER_HI)
    assert refused.value.body["code"] == "chat_template_missing"  # type: ignore[index]
    # /v1/completions takes a raw prompt; the API's default of 16 tokens is not the
    # client's, so a model without a max_tokens input serves it.
    completion = await client.completions.create(model="fake-custom", prompt="Hi")
    assert completion.choices[0].text == REPLY
    assert fake.calls[-1].options.max_tokens is None
    listed = {m.id: m.model_extra for m in (await client.models.list()).data}
    assert listed["fake-custom"]["chat_template"] is False
    assert listed["fake-custom"]["parameters"] == ["stop"]
    assert listed["fake-chat"]["chat_template"] is True
