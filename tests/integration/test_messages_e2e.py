"""Anthropic's Messages API on the real stack (nginx, two replicas, Triton, Redis) with the
official ``anthropic`` SDK: text and its stream on mock_chat and SmolLM2, a tool round trip,
a reasoning model's thinking (mock_qwen3, loaded through the admin API), count_tokens, and a
key's model allow-list, in Anthropic's error shape."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.bodies import mock_say
from tests.support.shapes import CLAUDE_WEATHER
from tests.support.shared_stack import UPLOAD_LIMIT_MB
from tests.support.stack import GatewayProcess

CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


@pytest.fixture(scope="module")
def claude(stack: GatewayProcess) -> anthropic.Anthropic:
    with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=120) as http:
        answer = http.post("/admin/models/mock_qwen3/load")
        assert answer.status_code == 200, answer.text
    return anthropic.Anthropic(base_url=stack.base_url, api_key=stack.admin_key, max_retries=0)


def ask(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_text_whole_and_streamed_through_nginx(claude: anthropic.Anthropic) -> None:
    sentence = "Paris is the capital of France."
    message = claude.messages.create(
        model="mock_chat", max_tokens=64, messages=ask(f"Capital? {mock_say(sentence)}")
    )
    assert message.content[0].text == sentence  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0
    with claude.messages.stream(
        model="mock_chat", max_tokens=64, messages=ask(f"Capital? {mock_say(sentence)}")
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == sentence and final.usage.input_tokens > 0


def test_smollm2_answers_and_max_tokens_cuts_it(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model="smollm2", max_tokens=5, messages=ask("Tell me about the sea.")
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5
    assert message.content[0].text.strip()  # type: ignore[union-attr]


def test_a_tool_round_trip_on_mock_chat(claude: anthropic.Anthropic) -> None:
    call = f"<tool_call>{json.dumps(CALL)}</tool_call>"
    asked = claude.messages.create(
        model="mock_chat",
        max_tokens=64,
        messages=ask(f"Weather? {mock_say(call)}"),
        tools=[CLAUDE_WEATHER],
    )
    assert asked.stop_reason == "tool_use"
    (use,) = [block for block in asked.content if block.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    answer = claude.messages.create(
        model="mock_chat",
        max_tokens=64,
        tools=[CLAUDE_WEATHER],
        messages=[
            {"role": "user", "content": f"Weather? {mock_say('It is sunny in Paris.')}"},
            {"role": "assistant", "content": [block.model_dump() for block in asked.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ],
    )
    assert answer.content[0].text == "It is sunny in Paris."  # type: ignore[union-attr]


def test_thinking_from_a_reasoning_model(claude: anthropic.Anthropic) -> None:
    thought = "The user asks where; I know it is Paris."
    prompt = f"Where? [mock:think={urllib.parse.quote(thought)}] {mock_say('Paris.')}"
    with claude.messages.stream(
        model="mock_qwen3",
        max_tokens=256,
        messages=ask(prompt),
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking.strip() == thought  # type: ignore[union-attr]
    assert final.content[1].text.strip() == "Paris."  # type: ignore[union-attr]


def test_count_tokens_and_a_keys_allow_list(
    claude: anthropic.Anthropic, stack: GatewayProcess
) -> None:
    short = claude.messages.count_tokens(model="mock_chat", messages=ask("Hi"))
    longer = claude.messages.count_tokens(
        model="mock_chat", messages=ask("Hi"), system="You answer in one word, always."
    )
    assert 0 < short.input_tokens < longer.input_tokens
    key = stack.create_key("messages", models=["smollm2"])["key"]
    user = anthropic.Anthropic(base_url=stack.base_url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        user.messages.create(model="mock_chat", max_tokens=8, messages=ask("Hi"))
    assert refused.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    assert user.messages.create(model="smollm2", max_tokens=2, messages=ask("Hi")).content


def test_nginxs_own_413_has_anthropics_shape(stack: GatewayProcess) -> None:
    # Over nginx's cap (the gateway's request limit, UPLOAD_LIMIT_MB + 1 on this stack).
    huge = b'{"model": "mock_chat", "x": "' + b"x" * ((UPLOAD_LIMIT_MB + 2) * 1024 * 1024) + b'"}'
    headers = {"x-api-key": stack.admin_key, "content-type": "application/json"}
    refused = httpx.post(stack.base_url + "/v1/messages", content=huge, headers=headers)
    assert refused.status_code == 413, refused.text
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "request_too_large"
