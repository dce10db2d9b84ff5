"""The Conversations API and what /v1/responses reads from stored state (``conversation=``,
``item_reference``) end to end: the official openai client -> nginx -> gateway replicas ->
real Triton (mock_chat, whose ``[mock:say=...]`` directive makes its answer depend on the
conversation it is shown) -> the real Redis."""

from __future__ import annotations

import openai
import pytest

from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration


def said(text: str) -> dict[str, str]:
    return {"type": "message", "role": "user", "content": text}


def test_conversations_and_items_crud(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(
        items=[said("one"), said("two")], metadata={"a": "1"}
    )
    assert client.conversations.retrieve(conversation.id).metadata == {"a": "1"}
    assert client.conversations.update(conversation.id, metadata={"a": "2"}).metadata == {"a": "2"}
    (added,) = client.conversations.items.create(conversation.id, items=[said("three")]).data
    page = client.conversations.items.list(conversation.id, order="asc")
    assert [item.content[0].text for item in page.data] == ["one", "two", "three"]  # type: ignore[union-attr]
    got = client.conversations.items.retrieve(added.id, conversation_id=conversation.id)
    assert got.id == added.id
    client.conversations.items.delete(added.id, conversation_id=conversation.id)
    assert len(client.conversations.items.list(conversation.id).data) == 2
    assert client.conversations.delete(conversation.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(conversation.id)


def test_two_turns_in_a_conversation_and_its_items_in_order(client: openai.OpenAI) -> None:
    conversation = client.conversations.create()
    first = client.responses.create(
        model="mock_chat", input="[mock:say=pineapple] remember", conversation=conversation.id
    )
    assert first.output_text == "pineapple"
    assert first.conversation is not None and first.conversation.id == conversation.id
    # The second answer comes from the first turn, which only the conversation carries:
    # shown this input alone, mock_chat would answer its fixed sentence.
    second = client.responses.create(
        model="mock_chat", input="which word?", conversation={"id": conversation.id}, store=False
    )
    assert second.output_text == "pineapple"
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [getattr(item, "role", None) for item in items] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert items[1].id == first.output[0].id and items[3].id == second.output[0].id
    alone = client.responses.create(model="mock_chat", input="which word?", store=False)
    assert alone.output_text != "pineapple"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="mock_chat",
            input="hi",
            conversation=conversation.id,
            previous_response_id=first.id,
        )
    assert caught.value.code == "mutually_exclusive_parameters"


def test_item_reference_and_another_keys_ids(stack: GatewayProcess, client: openai.OpenAI) -> None:
    first = client.responses.create(model="mock_chat", input="[mock:say=mango] a fruit")
    # The Vercel AI SDK's second turn: the earlier answer by reference, no previous_response_id.
    second = client.responses.create(
        model="mock_chat",
        input=[said("hi"), {"type": "item_reference", "id": first.output[0].id}, said("again")],
    )
    assert second.output_text != "mango"  # the directive was in the first input, not sent
    asked = client.responses.input_items.list(first.id).data[0]
    third = client.responses.create(
        model="mock_chat", input=[{"type": "item_reference", "id": asked.id}, said("again")]
    )
    assert third.output_text == "mango"  # the referenced input carries the directive
    stranger = stack.client(stack.user_headers()["Authorization"].removeprefix("Bearer "))
    with pytest.raises(openai.BadRequestError) as caught:
        stranger.responses.create(
            model="mock_chat", input=[{"type": "item_reference", "id": asked.id}]
        )
    assert caught.value.code == "item_not_found"
    assert caught.value.body["param"] == "input[0].id"  # type: ignore[index]
    conversation = client.conversations.create(items=[said("mine")])
    with pytest.raises(openai.NotFoundError):
        stranger.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.create(model="mock_chat", input="hi", conversation=conversation.id)
