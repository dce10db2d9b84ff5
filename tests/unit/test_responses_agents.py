"""What today's agents send to /v1/responses (issue 36): stateless turns with sealed
reasoning, ``client_metadata``, reasoning summaries, namespace tools, hosted tools refused by
name, ``truncation: "auto"``, the newer enum values."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.backend import ImageInput, ModelInfo
from gateway.backend.fake import FakeBackend
from gateway.serving.images import ImageReader
from gateway.serving.reasoning import highest_effort
from gateway.serving.responses.sealing import ReasoningSeal
from tests.support.bodies import assert_openai_error, response_events
from tests.support.images import VISION_TEMPLATE, data_url, picture
from tests.support.inprocess import new_key, sdk

#: A reasoning model whose template shows earlier reasoning and reads reasoning_effort
#: (naming its efforts as gpt-oss's templates do).
THINKER_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>"
    "{% if m.reasoning_content %}[thought: {{ m.reasoning_content }}]{% endif %}"
    "{{ m.content or '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if reasoning_effort in ['low', 'medium', 'high'] %}effort={{ reasoning_effort }}"
    "{% endif %}{% endif %}"
)
THOUGHT = "<think> I weigh it. </think> The answer."
CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "The customer records.",
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "description": "Find a customer.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        }
    ],
}
CRM_CALL = '<tool_call> {"name": "crm__lookup", "arguments": {"id": "7"}} </tool_call>'


@pytest.fixture
def fake() -> FakeBackend:
    backend = FakeBackend()
    backend.model_list += [
        ModelInfo("fake-thinker", "chat", True, THINKER_TEMPLATE, 2048, reasoning_parser="qwen3"),
        ModelInfo("fake-vision", "chat", True, VISION_TEMPLATE, 2048, image_input=ImageInput()),
    ]
    return backend


async def test_a_stateless_turn_gets_its_reasoning_sealed_and_the_next_turn_opens_it(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = THOUGHT
    first = await client.responses.create(
        model="fake-thinker",
        input="Hi",
        store=False,
        include=["reasoning.encrypted_content"],
        reasoning={"summary": "auto"},
    )
    reasoning, message = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert "I weigh it" not in reasoning.encrypted_content  # sealed, not encoded
    assert reasoning.summary == []  # the model wrote no summary: none is invented
    assert first.reasoning is not None and first.reasoning.summary == "auto"
    # Codex sends the reasoning back with only its sealed form.
    sent_back = {
        "type": "reasoning",
        "id": reasoning.id,
        "summary": [],
        "encrypted_content": reasoning.encrypted_content,
    }
    earlier = {"role": "assistant", "content": message.content[0].text}
    fake.reply = "Done."
    await client.responses.create(
        model="fake-thinker",
        input=[
            {"role": "user", "content": "Hi"},
            sent_back,
            earlier,
            {"role": "user", "content": "Again"},
        ],
        store=False,
    )
    assert "[thought: I weigh it.]The answer." in fake.calls[-1].prompt


@pytest.mark.parametrize("stream", [False, True])
async def test_a_model_that_does_not_reason_returns_no_reasoning_item(
    http: httpx.AsyncClient, stream: bool
) -> None:
    body = {
        "model": "fake-chat",
        "input": "Hi",
        "store": False,
        "stream": stream,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"summary": "detailed"},
    }
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    if stream:
        done = [e for e in response_events(reply.text) if e["type"] == "response.completed"]
        output = done[0]["response"]["output"]
    else:
        output = reply.json()["output"]
    assert [item["type"] for item in output] == ["message"]


async def test_the_sealed_reasoning_is_streamed_on_the_items_done_event(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = THOUGHT
    body = {
        "model": "fake-thinker",
        "input": "Hi",
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    events = response_events((await http.post("/v1/responses", json=body)).text)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["type"] == "reasoning" and done[0]["encrypted_content"]


async def test_a_tampered_or_foreign_sealed_reasoning_is_refused(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = THOUGHT
    body: dict[str, Any] = {
        "model": "fake-thinker",
        "input": "Hi",
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    sealed = (await http.post("/v1/responses", json=body)).json()["output"][0]["encrypted_content"]
    tampered = sealed[:-8] + ("A" if sealed[-8] != "A" else "B") + sealed[-7:]
    # Sealed by another gateway (another key), and for another API key of this one.
    elsewhere = ReasoningSeal([ReasoningSeal.new_key()]).sealer("any", "fake-thinker")("x")
    key = await new_key(http)
    other = sdk(http, key["key"])
    for bad in (tampered, elsewhere):
        item = {"type": "reasoning", "summary": [], "encrypted_content": bad}
        body["input"] = [item, {"role": "user", "content": "Again"}]
        reply = await http.post("/v1/responses", json=body)
        assert_openai_error(
            reply, 400, param="input[0].encrypted_content", code="invalid_encrypted_content"
        )
    item = {"type": "reasoning", "summary": [], "encrypted_content": sealed}
    with pytest.raises(openai.BadRequestError) as refused:
        await other.responses.create(
            model="fake-thinker", input=[item, {"role": "user", "content": "Again"}]
        )
    assert refused.value.code == "invalid_encrypted_content"


def test_seal_keys_rotate_new_first_old_still_opening() -> None:
    old, new = ReasoningSeal.new_key(), ReasoningSeal.new_key()
    sealed_before = ReasoningSeal([old]).sealer("k1", "m")("the thought")
    rotated = ReasoningSeal([new, old])
    assert rotated.open(sealed_before, "k1", "p") == "the thought"
    sealed_after = rotated.sealer("k1", "m")("later")
    with pytest.raises(Exception, match="not made by this gateway"):
        ReasoningSeal([old]).open(sealed_after, "k1", "p")  # sealed under the new key


async def test_client_metadata_is_accepted_and_never_stored_or_echoed(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    response = await client.responses.create(
        model="fake-chat",
        input="Hi",
        extra_body={"client_metadata": {"session_id": "s-1", "turn_id": "t-1"}},
    )
    stored = (await http.get(f"/v1/responses/{response.id}")).text
    assert "client_metadata" not in stored and "s-1" not in stored
    assert "client_metadata" not in (response.model_extra or {})


async def test_namespace_functions_are_offered_and_their_calls_reported_as_openai_does(
    client: openai.AsyncOpenAI, fake: FakeBackend, http: httpx.AsyncClient
) -> None:
    fake.reply = CRM_CALL
    response = await client.responses.create(model="fake-chat", input="Who is 7?", tools=[CRM])
    assert '"name": "crm__lookup"' in fake.calls[-1].prompt
    assert "The customer records." in fake.calls[-1].prompt
    (call,) = response.output
    assert call.type == "function_call"
    assert (call.name, call.namespace) == ("lookup", "crm")
    assert json.loads(call.arguments) == {"id": "7"}
    # Sent back with its output (stateless), the call is the model's own again.
    fake.reply = "Customer 7 is Ada."
    follow = await client.responses.create(
        model="fake-chat",
        store=False,
        tools=[CRM],
        input=[
            {"role": "user", "content": "Who is 7?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "lookup",
                "namespace": "crm",
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Ada"},
        ],
    )
    assert follow.output_text == "Customer 7 is Ada."
    assert fake.calls[-1].prompt.count("crm__lookup") >= 2  # offered, and called before
    # Streamed, the call's items carry the namespace too.
    fake.reply = CRM_CALL
    body = {"model": "fake-chat", "input": "Who is 7?", "tools": [CRM], "stream": True}
    events = response_events((await http.post("/v1/responses", json=body)).text)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert (done[0]["name"], done[0]["namespace"]) == ("lookup", "crm")


@pytest.mark.parametrize(
    ("tool", "told"),
    [
        ({"type": "web_search", "external_web_access": False}, 'web_search = "disabled"'),
        ({"type": "file_search", "vector_store_ids": ["vs_1"]}, "file_search"),
        ({"type": "code_interpreter", "container": {"type": "auto"}}, "code_interpreter"),
        ({"type": "mcp", "server_label": "x", "server_url": "https://x"}, "mcp"),
        ({"type": "image_generation"}, "image_generation"),
        ({"type": "computer_use_preview", "display_width": 1, "display_height": 1,
          "environment": "linux"}, "computer_use_preview"),
    ],
)  # fmt: skip
async def test_hosted_tools_are_refused_by_their_type(
    http: httpx.AsyncClient, fake: FakeBackend, tool: dict[str, Any], told: str
) -> None:
    body = {"model": "fake-chat", "input": "Hi", "tools": [{**CRM}, tool]}
    error = assert_openai_error(
        await http.post("/v1/responses", json=body), 400, param="tools[1].type"
    )
    assert error["code"] == "unsupported_tool" and told in error["message"]
    assert not error["message"].startswith("Unrecognized")
    assert not fake.calls


async def test_truncation_auto_drops_the_oldest_turns_until_the_input_fits(
    client: openai.AsyncOpenAI, fake: FakeBackend, http: httpx.AsyncClient
) -> None:
    # fake-chat's context is 2048 tokens; each old turn is 8,000 bytes, so at least 250
    # tokens (the gateway's judgement: 32 bytes a token at most).
    old = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "x" * 8000}
        for i in range(12)
    ]
    body = {
        "model": "fake-chat",
        "instructions": "Be brief.",
        "input": [*old, {"role": "user", "content": "The newest question"}],
        "max_output_tokens": 64,
    }
    refused = await http.post("/v1/responses", json={**body, "truncation": "disabled"})
    assert_openai_error(refused, 400, code="context_length_exceeded")
    response = await client.responses.create(**body, truncation="auto")
    assert response.status == "completed" and response.truncation == "auto"
    dropped = (response.model_extra or {})["truncated_messages"]
    prompt = fake.calls[-1].prompt
    assert 0 < dropped < len(old)
    assert "Be brief." in prompt and "The newest question" in prompt
    assert "turn 0 " not in prompt and f"turn {len(old) - 1} " in prompt  # oldest went first
    assert f"turn {dropped - 1} " not in prompt and f"turn {dropped} " in prompt


async def test_newer_enum_values_are_accepted(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    for tier in ("fast", "ultrafast"):
        response = await client.responses.create(model="fake-chat", input="Hi", service_tier=tier)
        assert response.service_tier == "default"  # the one tier that served it
    fake.reply = THOUGHT
    await client.responses.create(model="fake-thinker", input="Hi", reasoning={"effort": "max"})
    assert fake.calls[-1].prompt.endswith("effort=high")  # the template's highest
    reply = await client.chat.completions.create(
        model="fake-thinker",
        messages=[{"role": "user", "content": "Hi"}],
        reasoning_effort="max",
    )
    assert fake.calls[-1].prompt.endswith("effort=high")
    assert reply.choices[0].message.content == "The answer."


def test_the_highest_effort_is_the_highest_the_template_names() -> None:
    assert highest_effort("{% if reasoning_effort == 'low' %}{% endif %}") == "low"
    assert highest_effort("""x == "xhigh" or x == 'medium'""") == "xhigh"
    assert highest_effort("{{ reasoning_effort }}") == "high"


async def test_a_named_tool_choice_finishes_with_stop(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = '{"city": "Paris"}'
    weather = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = await client.chat.completions.create(
        model="fake-chat", messages=[{"role": "user", "content": "Hi"}], tools=[weather],
        tool_choice=named,
    )  # fmt: skip
    assert reply.choices[0].message.tool_calls and reply.choices[0].finish_reason == "stop"
    fake.reply = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    reply = await client.chat.completions.create(
        model="fake-chat", messages=[{"role": "user", "content": "Hi"}], tools=[weather],
        tool_choice="required",
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "tool_calls"


async def test_namespaces_count_their_functions_towards_the_bound(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    functions = [{"type": "function", "name": f"f{i}"} for i in range(100)]
    namespaces = [{**CRM, "name": f"ns{i}", "tools": functions} for i in range(2)]
    body = {"model": "fake-chat", "input": "Hi", "tools": namespaces}
    error = assert_openai_error(await http.post("/v1/responses", json=body), 400, param="tools")
    assert "128 functions" in error["message"]
    assert not fake.calls


async def test_truncation_reads_the_kept_images_once(
    client: openai.AsyncOpenAI, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turns that fit are found by trials that read no image: the images of what is
    sent are fetched and decoded once, not once a trial."""
    reads: list[int] = []
    original = ImageReader.read

    async def counted(self: ImageReader, messages: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(len(messages))
        return await original(self, messages, *args, **kwargs)

    monkeypatch.setattr(ImageReader, "read", counted)
    image = {"type": "input_image", "image_url": data_url(picture(8, 8)), "detail": "low"}
    old = [{"role": "user", "content": f"turn {i} " + "x" * 8000} for i in range(12)]
    newest = {"role": "user", "content": [{"type": "input_text", "text": "What?"}, image]}
    response = await client.responses.create(
        model="fake-vision", input=[*old, newest], truncation="auto", max_output_tokens=16
    )
    assert (response.model_extra or {})["truncated_messages"] > 0
    assert len(reads) == 1 and len(fake.calls[-1].images) == 1
