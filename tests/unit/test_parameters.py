"""Every official parameter of chat and legacy completions is honoured, refused by name with
the reason, or accepted as a documented hint; vLLM's sampling extensions (the SDK's
``extra_body``) are honoured where the model takes them and refused where it does not."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from gateway.backend import ModelInfo
from gateway.backend.fake import FakeBackend
from gateway.config import CHATML_TEMPLATE
from tests.support.bodies import USER_HI, assert_openai_error, chat_body
from tests.support.inprocess import REPLY

VLLM_EXTRAS = {
    "top_k": 40,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "min_tokens": 2,
    "ignore_eos": True,
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("web_search_options", {}),
        ("moderation", {"model": "omni-moderation-latest"}),
        ("verbosity", "low"),
        ("prediction", {"type": "content", "content": "Hello"}),
    ],
)
async def test_official_chat_parameters_not_implemented_are_refused_with_why(
    http: httpx.AsyncClient, fake: FakeBackend, field: str, value: Any
) -> None:
    response = await http.post("/v1/chat/completions", json=chat_body(**{field: value}))
    error = assert_openai_error(response, 400, param=field, code="unsupported_parameter")
    assert error["message"].startswith(f"{field} is not supported by this gateway: ")
    assert not fake.calls


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"stream": True, "stream_options": {"include_obfuscation": True}}, None),
    ],
)
async def test_options_that_would_change_nothing_here_are_refused(
    http: httpx.AsyncClient, fake: FakeBackend, fields: dict[str, Any], param: str | None
) -> None:
    """``audio`` without ``modalities: ["audio"]`` asks for a voice that would never speak;
    stream obfuscation is not done here."""
    response = await http.post("/v1/chat/completions", json=chat_body(**fields))
    error = assert_openai_error(response, 400, code="unsupported_parameter")
    assert error["param"] == (param or "stream_options.include_obfuscation")
    assert not fake.calls


async def test_hints_are_accepted(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model="fake-chat",
        messages=USER_HI,
        user="u1",
        safety_identifier="hashed-user",
        prompt_cache_key="conversation-7",
        service_tier="fast",
        prompt_cache_retention="24h",
        prompt_cache_options={"mode": "explicit", "ttl": "30m"},
    )
    assert reply.choices[0].message.content == REPLY
    assert reply.service_tier == "default"  # the one tier here served it
    stream = await client.chat.completions.create(
        model="fake-chat",
        messages=USER_HI,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    assert [c async for c in stream][-1].usage is not None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stream": True, "stream_options": {"include_usage": True, "chunk": 1}}, "chunk"),
        ({"response_format": {"type": "json_object", "strict": True}}, "strict"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "returns": {}}}]},
            "returns",
        ),
        ({"audio": {"voice": "alloy", "speed": 2}, "modalities": ["audio"]}, "speed"),
    ],
)
async def test_unknown_nested_fields_are_refused_by_name(
    http: httpx.AsyncClient, fields: dict[str, Any], param: str
) -> None:
    response = await http.post("/v1/chat/completions", json=chat_body(**fields))
    error = assert_openai_error(response, 400, code="unsupported_parameter")
    assert error["param"].endswith(param), error


async def test_vllm_extensions_reach_the_model_in_its_names(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, max_tokens=8, extra_body=VLLM_EXTRAS
    )
    options = fake.calls[-1].options
    assert {name: getattr(options, name) for name in VLLM_EXTRAS} == VLLM_EXTRAS
    await client.completions.create(
        model="fake-chat", prompt="Hi", extra_body={"top_k": 0, "repetition_penalty": 1.2}
    )
    # 0 is vLLM's newer "no cut"; -1 is what every vLLM release takes.
    assert (fake.calls[-1].options.top_k, fake.calls[-1].options.repetition_penalty) == (-1, 1.2)


@pytest.mark.parametrize("name", sorted(VLLM_EXTRAS))
async def test_each_vllm_extension_is_honoured_or_refused_by_the_model(
    client: openai.AsyncOpenAI, fake: FakeBackend, name: str
) -> None:
    extra = {name: VLLM_EXTRAS[name]}
    await client.chat.completions.create(model="fake-chat", messages=USER_HI, extra_body=extra)
    assert getattr(fake.calls[-1].options, name) == VLLM_EXTRAS[name]
    fake.model_list.append(
        ModelInfo("fake-strict", "chat", True, CHATML_TEMPLATE, 2048, takes=frozenset({"stop"}))
    )
    for create in (
        lambda: client.chat.completions.create(
            model="fake-strict", messages=USER_HI, extra_body=extra
        ),
        lambda: client.completions.create(model="fake-strict", prompt="Hi", extra_body=extra),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            await create()
        assert refused.value.body["param"] == name  # type: ignore[index]
        assert refused.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
        assert "does not take" in refused.value.message
    assert len(fake.calls) == 1


async def test_models_list_the_vllm_extensions_they_take(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.model_list.append(
        ModelInfo("fake-strict", "chat", True, CHATML_TEMPLATE, 2048, takes=frozenset({"stop"}))
    )
    listed = {m.id: m.model_extra for m in (await client.models.list()).data}
    assert set(VLLM_EXTRAS) <= set(listed["fake-chat"]["parameters"])
    assert listed["fake-strict"]["parameters"] == ["stop"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ],
)
async def test_vllm_extensions_out_of_range_are_400(
    http: httpx.AsyncClient, fake: FakeBackend, extra: dict[str, Any], param: str
) -> None:
    response = await http.post("/v1/chat/completions", json=chat_body(**extra))
    error = assert_openai_error(response, 400, param=param)
    assert "Unrecognized" not in error["message"]  # it says what is wrong with the value
    assert not fake.calls


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {"model": "fake-chat", "messages": [{"role": "user", "content": "Hi"}]},
        ),
        ("/v1/responses", {"model": "fake-chat", "input": "Hi"}),
        ("/v1/embeddings", {"model": "fake-embed", "input": "Hi"}),
    ],
)
async def test_hints_are_bounded_since_they_are_echoed_and_stored(
    http: httpx.AsyncClient, path: str, body: dict[str, object]
) -> None:
    refused = await http.post(path, json={**body, "user": "u" * 1_000_000})
    assert_openai_error(refused, 400, param="user")


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "Hi", "colour": "red"}, "messages.0.colour"),
        (
            {"role": "user", "content": [{"type": "text", "text": "Hi", "bold": True}]},
            "messages.0.content",
        ),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}", "strict": 1},
                    }
                ],
            },
            "messages.0.tool_calls.0.function.strict",
        ),
    ],
)
async def test_unknown_fields_inside_messages_are_refused_by_name(
    http: httpx.AsyncClient, message: dict[str, Any], param: str
) -> None:
    body = chat_body(messages=[message, *USER_HI])
    error = assert_openai_error(await http.post("/v1/chat/completions", json=body), 400)
    assert error["param"].startswith(param.split(".")[0])
    assert param.rsplit(".", 1)[-1] in error["message"]


async def test_what_the_sdk_puts_on_an_answer_can_be_sent_back(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    # An answer as the SDK returns it (its parse helpers add parsed and parsed_arguments;
    # a refusal stands for empty content) goes back as history unchanged.
    answer = {
        "role": "assistant",
        "content": None,
        "refusal": "I cannot help with that.",
        "annotations": [],
        "parsed": None,
        "audio": None,
        "function_call": None,
        "tool_calls": None,
    }
    await client.chat.completions.create(
        model="fake-chat", messages=[*USER_HI, answer, {"role": "user", "content": "Why?"}]
    )
    assert "I cannot help with that." in fake.calls[-1].prompt


async def test_a_misspelt_key_limit_is_refused_not_ignored(http: httpx.AsyncClient) -> None:
    created = await http.post("/admin/keys", json={"name": "k", "max_conccurency": 2})
    error = assert_openai_error(created, 400)
    assert "max_conccurency" in error["message"]
