"""Stored chat completions end to end: the official openai client -> nginx (or one replica
directly) -> gateway -> real Triton (mock_chat), the completions stored in the real Redis.
Each test uses a key of its own, so its list holds only what it stored."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

HELLO: Any = [{"role": "user", "content": "Say hello."}]


def own_client(stack: GatewayProcess, address: str | None = None) -> tuple[openai.OpenAI, str]:
    """A client with a new key of its own (through nginx, or one replica at ``address``),
    and that key."""
    key = stack.create_key("stored chat")["key"]
    if address is None:
        return stack.client(key), key
    url = f"http://{address}/v1"
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0), key


def test_store_list_retrieve_update_messages_and_delete_across_replicas(
    stack: GatewayProcess,
) -> None:
    first_address, second_address = stack.replica_addresses()
    first, key = own_client(stack, first_address)
    second = openai.OpenAI(base_url=f"http://{second_address}/v1", api_key=key, max_retries=0)
    made = [
        first.chat.completions.create(
            model="mock_chat",
            messages=[{"role": "system", "content": "Be brief."}, *HELLO],
            store=True,
            metadata={"user": "ann" if i < 3 else "bob", "run": str(i)},
            max_tokens=8,
        )
        for i in range(4)
    ]
    ids = [m.id for m in made]
    # Another replica sees them all, oldest first, page by page.
    assert [c.id for c in second.chat.completions.list(limit=3)] == ids
    newest = second.chat.completions.list(order="desc", limit=2)
    assert [c.id for c in newest.data] == ids[:1:-1] and newest.has_more
    anns = second.chat.completions.list(model="mock_chat", metadata={"user": "ann"}, limit=2)
    assert [c.id for c in anns.data] == ids[:2] and anns.has_more
    rest = second.chat.completions.list(metadata={"user": "ann"}, after=ids[1])
    assert [c.id for c in rest.data] == [ids[2]] and not rest.has_more
    assert second.chat.completions.list(model="smollm2").data == []

    stored = second.chat.completions.retrieve(ids[0])
    assert stored.metadata == {"user": "ann", "run": "0"}
    assert stored.choices[0].message.content == made[0].choices[0].message.content
    assert stored.usage == made[0].usage
    messages = second.chat.completions.messages.list(ids[0])
    assert [(m.id, m.role, m.content) for m in messages.data] == [
        (f"{ids[0]}-0", "system", "Be brief."),
        (f"{ids[0]}-1", "user", "Say hello."),
    ]

    updated = second.chat.completions.update(ids[3], metadata={"user": "ann"})
    assert updated.metadata == {"user": "ann"}
    assert first.chat.completions.retrieve(ids[3]).metadata == {"user": "ann"}
    assert [c.id for c in first.chat.completions.list(metadata={"user": "ann"})] == ids

    deleted = first.chat.completions.delete(ids[0])
    assert (deleted.id, deleted.deleted, deleted.object) == (
        ids[0],
        True,
        "chat.completion.deleted",
    )
    with pytest.raises(openai.NotFoundError) as gone:
        second.chat.completions.retrieve(ids[0])
    assert gone.value.code == "not_found"
    assert [c.id for c in second.chat.completions.list()] == ids[1:]


def test_another_key_cannot_see_or_change_a_stored_completion(stack: GatewayProcess) -> None:
    owner, _ = own_client(stack)
    other, _ = own_client(stack)
    made = owner.chat.completions.create(
        model="mock_chat",
        messages=HELLO,
        store=True,
        max_tokens=4,
    )
    for attempt in (
        lambda: other.chat.completions.retrieve(made.id),
        lambda: other.chat.completions.update(made.id, metadata={"k": "v"}),
        lambda: other.chat.completions.messages.list(made.id),
        lambda: other.chat.completions.delete(made.id),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert other.chat.completions.list().data == []
    assert owner.chat.completions.retrieve(made.id).metadata == {}


def test_a_streamed_completion_is_stored_and_unstored_ones_are_not(
    stack: GatewayProcess,
) -> None:
    client, _ = own_client(stack)
    stream = client.chat.completions.create(
        model="mock_chat", messages=HELLO, store=True, n=2, max_tokens=8, stream=True
    )
    texts, finishes, ids = ["", ""], ["", ""], set()
    for chunk in stream:
        ids.add(chunk.id)
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    [completion_id] = ids
    stored = client.chat.completions.retrieve(completion_id)
    assert [c.message.content for c in stored.choices] == texts
    assert all(texts) and [c.finish_reason for c in stored.choices] == finishes
    assert stored.usage is not None and stored.usage.completion_tokens > 0
    unstored = client.chat.completions.create(
        model="mock_chat",
        messages=HELLO,
        metadata={"k": "v"},
        max_tokens=4,
    )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(unstored.id)
    assert [c.id for c in client.chat.completions.list()] == [completion_id]
