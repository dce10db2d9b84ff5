"""What today's agents send to /v1/responses, end to end (issue 36): the official openai
client -> nginx (or a replica) -> gateway -> real Triton (``mock_chat``, ``mock_qwen3``).

A Codex-style turn is stateless (``store: false``, everything sent back): its reasoning
comes sealed, and the next turn, on the other replica, sends it back with the namespace
tool's call and its output."""

from __future__ import annotations

import json
import urllib.parse

import httpx
import openai
import pytest

from tests.support.shapes import WEATHER
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "The customer records.",
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "description": "Find a customer by id.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "string"}},
                "required": ["id"],
            },
        }
    ],
}
CALL = '<tool_call> {"name": "crm__lookup", "arguments": {"id": "7"}} </tool_call>'
THOUGHT = "I should look the customer up."


def steer(text: str, say: str) -> str:
    """A prompt that makes mock_qwen3 think :data:`THOUGHT` and answer ``say``."""
    quoted = urllib.parse.quote(say, safe="")
    return f"{text} [mock:think={urllib.parse.quote(THOUGHT)}] [mock:say={quoted}]"


@pytest.fixture(scope="module")
def replicas(stack: GatewayProcess) -> list[openai.OpenAI]:
    with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=120) as http:
        answer = http.post("/admin/models/mock_qwen3/load")
        assert answer.status_code == 200, answer.text
    return [
        openai.OpenAI(base_url=f"http://{a}/v1", api_key=stack.admin_key, max_retries=0)
        for a in stack.replica_addresses()
    ]


def test_a_stateless_agent_turn_and_the_next_on_another_replica(
    replicas: list[openai.OpenAI],
) -> None:
    first_replica, second_replica = replicas
    question = {"role": "user", "content": steer("Who is customer 7?", CALL)}
    common = {
        "model": "mock_qwen3",
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"summary": "auto"},
        "parallel_tool_calls": True,
        "prompt_cache_key": "session-1",
        "tools": [CRM],
        "extra_body": {"client_metadata": {"session_id": "s-1", "turn_id": "t-1"}},
    }
    items: dict[str, dict[str, object]] = {}
    with first_replica.responses.stream(input=[question], **common) as stream:  # type: ignore[arg-type]
        for event in stream:
            if event.type == "response.output_item.done":
                items[event.item.type] = event.item.model_dump(exclude_none=True)
        final = stream.get_final_response()
    reasoning, call = items["reasoning"], items["function_call"]
    assert reasoning["encrypted_content"] and THOUGHT not in str(reasoning["encrypted_content"])
    assert reasoning["summary"] == []
    assert (call["name"], call["namespace"]) == ("lookup", "crm")
    assert json.loads(str(call["arguments"])) == {"id": "7"}
    assert final.reasoning is not None and final.reasoning.summary == "auto"
    with pytest.raises(openai.NotFoundError):  # store: false kept nothing
        first_replica.responses.retrieve(final.id)
    # The next turn, as Codex sends it: everything back, the reasoning only sealed.
    token = str(reasoning["encrypted_content"])
    sent_back = {"type": "reasoning", "summary": [], "encrypted_content": token}
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "Ada"}
    call_back = {k: call[k] for k in ("type", "call_id", "name", "namespace", "arguments")}
    second = second_replica.responses.create(
        input=[question, sent_back, call_back, output],  # type: ignore[list-item]
        **common,  # type: ignore[arg-type]
    )
    assert second.status == "completed" and second.output
    # mock_qwen3 counts a prompt's words: the second prompt holds the call and its output.
    assert final.usage is not None and second.usage is not None
    assert second.usage.input_tokens > final.usage.input_tokens + 3
    # Changed by one character, it is refused by name, before anything is generated.
    changed = token[:-6] + ("A" if token[-6] != "A" else "B") + token[-5:]
    tampered = {**sent_back, "encrypted_content": changed}
    with pytest.raises(openai.BadRequestError) as refused:
        second_replica.responses.create(
            input=[question, tampered, call_back, output],  # type: ignore[list-item]
            **common,  # type: ignore[arg-type]
        )
    assert refused.value.code == "invalid_encrypted_content"
    assert refused.value.param == "input[1].encrypted_content"  # type: ignore[attr-defined]


def test_a_hosted_tool_is_refused_by_its_type(stack: GatewayProcess) -> None:
    client = stack.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="mock_chat",
            input="Hi",
            tools=[{"type": "web_search", "external_web_access": False}],  # type: ignore[list-item]
        )
    assert refused.value.code == "unsupported_tool"
    assert 'web_search = "disabled"' in refused.value.message


def test_truncation_auto_keeps_the_newest_turns(replicas: list[openai.OpenAI]) -> None:
    client = replicas[0]
    # mock_qwen3's context is 4,096 tokens; 8,000 bytes are at least 250 of them.
    old = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn{i} " + "x" * 8000}
        for i in range(20)
    ]
    body = {
        "model": "mock_qwen3",
        "input": [*old, {"role": "user", "content": "newest"}],
        "max_output_tokens": 4,
    }
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**body)  # type: ignore[arg-type]
    assert refused.value.code == "context_length_exceeded"
    response = client.responses.create(**body, truncation="auto")  # type: ignore[arg-type]
    dropped = (response.model_extra or {})["truncated_messages"]
    assert response.status == "incomplete" and response.truncation == "auto"
    assert 0 < dropped < len(old)
    # mock_qwen3 counts a prompt's words: the kept turns are two words each, and "newest"
    # (with the template's own few).
    assert response.usage is not None
    assert response.usage.input_tokens < 2 * (len(old) - dropped) + 30


def test_enum_values_the_sdk_advertises(stack: GatewayProcess) -> None:
    client = stack.client()
    response = client.responses.create(model="mock_chat", input="Hi", service_tier="ultrafast")
    assert response.service_tier == "default"
    reply = client.chat.completions.create(
        model="mock_chat",
        messages=[{"role": "user", "content": "Hi"}],
        service_tier="fast",
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = reply.choices[0]
    assert reply.service_tier == "default"
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.name == "get_weather"
    assert choice.finish_reason == "stop"  # a call the request named, as OpenAI answers
