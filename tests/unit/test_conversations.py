"""/v1/conversations and what /v1/responses reads from stored state (``conversation=``,
``item_reference``), through the official SDK against the fake backend and a real Redis:
the conversation's and its items' shapes, the bounds (items per request, per conversation,
the record's size, metadata), stored bytes and quotas, per-key isolation, and the errors'
codes and params."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
import redis
import redis.asyncio

from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.item_index import ENTRY_OVERHEAD, ItemIndex, entry_bytes
from gateway.state.stored_bytes import RECORD_OVERHEAD, StoredBytes
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import make_settings, new_key, sdk, serve

USER = {"type": "message", "role": "user", "content": "hello there"}
TWICE = {**USER, "id": "msg_1"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "4"}  # answers no call
UNKNOWN = {"type": "item_reference", "id": "msg_" + "0" * 48}


def said(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


async def test_crud_and_items_as_the_sdk_types_them(client: openai.AsyncOpenAI) -> None:
    conversation = await client.conversations.create(
        items=[said("first"), said("second")], metadata={"topic": "demo"}
    )
    assert conversation.id.startswith("conv_") and len(conversation.id) == 5 + 48
    assert conversation.object == "conversation" and conversation.metadata == {"topic": "demo"}
    assert (await client.conversations.retrieve(conversation.id)).created_at == (
        conversation.created_at
    )
    updated = await client.conversations.update(conversation.id, metadata={"topic": "new"})
    assert updated.metadata == {"topic": "new"}

    added = await client.conversations.items.create(conversation.id, items=[said("third")])
    assert [item.type for item in added.data] == ["message"]
    listed = [item async for item in client.conversations.items.list(conversation.id, limit=2)]
    texts = [item.content[0].text for item in listed]  # type: ignore[union-attr]
    assert texts == ["third", "second", "first"]  # newest first, over two pages
    ascending = await client.conversations.items.list(conversation.id, order="asc", limit=2)
    assert ascending.has_more and ascending.data[0].id == listed[-1].id

    one = await client.conversations.items.retrieve(listed[1].id, conversation_id=conversation.id)
    assert one.id == listed[1].id and one.type == "message" and one.role == "user"
    after = await client.conversations.items.delete(listed[1].id, conversation_id=conversation.id)
    assert after.id == conversation.id and after.object == "conversation"
    left = await client.conversations.items.list(conversation.id, order="asc")
    assert [i.id for i in left.data] == [listed[2].id, listed[0].id]
    with pytest.raises(openai.NotFoundError):
        await client.conversations.items.retrieve(listed[1].id, conversation_id=conversation.id)

    deleted = await client.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.object == "conversation.deleted"
    with pytest.raises(openai.NotFoundError):
        await client.conversations.retrieve(conversation.id)


async def test_another_keys_conversation_is_a_404_as_an_unknown_one(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    mine = await client.conversations.create(items=[said("secret")])
    other = sdk(http, (await new_key(http))["key"])
    for call in (
        other.conversations.retrieve(mine.id),
        other.conversations.items.list(mine.id),
        other.conversations.items.create(mine.id, items=[said("x")]),
        other.conversations.delete(mine.id),
        other.responses.create(model="fake-chat", input="hi", conversation=mine.id),
    ):
        with pytest.raises(openai.NotFoundError) as caught:
            await call
        assert caught.value.body["param"] == "conversation_id"  # type: ignore[index]
    assert len((await client.conversations.items.list(mine.id)).data) == 1  # untouched


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"items": [USER] * 21}, "items", None),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", None),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", None),
        ({"items": [{**USER, "role": "robot"}]}, "items[0].role", "invalid_value"),
        ({"items": [TWICE, TWICE]}, "items[1].id", "duplicate_item_id"),
        ({"items": [OUTPUT]}, "items[0].call_id", None),
        ({"items": [UNKNOWN]}, "items[0].id", "item_not_found"),
        ({"bogus": 1}, "bogus", None),
    ],
)  # fmt: skip
async def test_bad_creates_are_a_400_naming_the_parameter(
    http: httpx.AsyncClient, body: dict[str, Any], param: str, code: str | None
) -> None:
    error = assert_openai_error(await http.post("/v1/conversations", json=body), 400, param=param)
    assert error["code"] is not None
    if code is not None:
        assert error["code"] == code


async def test_include_values_nothing_here_makes_are_refused(client: openai.AsyncOpenAI) -> None:
    conversation = await client.conversations.create(items=[USER])
    page = await client.conversations.items.list(
        conversation.id, include=["message.output_text.logprobs"]
    )
    assert len(page.data) == 1
    with pytest.raises(openai.BadRequestError) as caught:
        await client.conversations.items.list(conversation.id, include=["file_search_call.results"])
    assert caught.value.body["param"] == "include[0]"  # type: ignore[index]
    assert caught.value.code == "unsupported_parameter"


@pytest.fixture
def settings() -> Settings:
    return make_settings(max_conversation_items=20, max_stored_kb=8)


async def test_a_conversation_is_bounded_in_items_and_bytes(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    conversation = await client.conversations.create(items=[USER] * 20)
    refused = await http.post(f"/v1/conversations/{conversation.id}/items", json={"items": [USER]})
    error = assert_openai_error(refused, 400, param="items", code="too_many_items")
    assert "GATEWAY_MAX_CONVERSATION_ITEMS" in error["message"]
    big = [said("x" * 5000), said("y" * 5000)]
    refused = await http.post("/v1/conversations", json={"items": big})
    assert_openai_error(refused, 400, param="items", code="stored_record_too_large")
    # A response's input that would take the conversation past its bound: refused before
    # anything is generated, and the conversation is unchanged.
    small = await client.conversations.create(items=[USER])
    calls = len(fake.calls)
    body = {"model": "fake-chat", "input": "z" * 8200, "conversation": small.id, "store": False}
    refused = await http.post("/v1/responses", json=body)
    assert_openai_error(refused, 400, param="conversation", code="stored_record_too_large")
    assert len(fake.calls) == calls
    assert len((await client.conversations.items.list(small.id)).data) == 1
    # An answer that takes it past its bound fails the response: nothing is appended, and
    # nothing stored.
    fake.reply = " ".join(["y" * 99] * 60)
    body = {"model": "fake-chat", "input": "z" * 3000, "conversation": small.id}
    refused = await http.post("/v1/responses", json=body)
    assert_openai_error(refused, 400, param="conversation", code="stored_record_too_large")
    assert len((await client.conversations.items.list(small.id)).data) == 1


async def test_stored_bytes_count_the_record_and_its_index(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    async def used() -> int:
        me = (await http.get("/v1/me")).json()
        return int(me["storage"]["key"]["used_bytes"])

    assert await used() == 0
    conversation = await client.conversations.create(items=[USER, said("two")])
    with redis.Redis.from_url(redis_server.url) as raw:
        (key,) = raw.keys("gw:conversation:*")
        record = raw.strlen(key)
        index = raw.keys("gw:item:*")
    assert len(index) == 2
    assert await used() >= record + RECORD_OVERHEAD + 2 * ENTRY_OVERHEAD
    await client.conversations.delete(conversation.id)
    assert await used() == 0
    with redis.Redis.from_url(redis_server.url) as raw:
        assert raw.keys("gw:item:*") == []


async def test_a_full_quota_refuses_new_items() -> None:
    async with serve(make_settings(stored_mb_per_key=0.002)) as (_, _http, client):
        conversation = await client.conversations.create(items=[USER])  # about 1 KB counted
        with pytest.raises(openai.PermissionDeniedError) as caught:
            await client.conversations.items.create(conversation.id, items=[said("x" * 1500)])
        assert caught.value.code == "storage_quota_exceeded"
        assert caught.value.body["param"] == "items"  # type: ignore[index]
        assert len((await client.conversations.items.list(conversation.id)).data) == 1


async def test_conversation_on_a_response_reads_and_appends(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    conversation = await client.conversations.create(items=[said("My name is Ada.")])
    first = await client.responses.create(
        model="fake-chat", input="What is my name?", conversation={"id": conversation.id}
    )
    assert first.conversation is not None and first.conversation.id == conversation.id
    prompt = fake.calls[-1].prompt
    assert prompt.index("My name is Ada.") < prompt.index("What is my name?")
    second = await client.responses.create(
        model="fake-chat", input="And again?", conversation=conversation.id, store=False
    )
    prompt = fake.calls[-1].prompt
    assert prompt.index("What is my name?") < prompt.index(fake.reply) < prompt.index("again?")
    items = (await client.conversations.items.list(conversation.id, order="asc")).data
    ids = [item.id for item in items]
    # The seed, then each turn's input and output, in order (store: false appends too).
    assert ids[2] == first.output[0].id and ids[4] == second.output[0].id
    roles = [getattr(item, "role", None) for item in items]
    assert roles == ["user", "user", "assistant", "user", "assistant"]
    # The response's input items list the conversation before its own input.
    listed = await client.responses.input_items.list(first.id, order="asc")
    assert [i.id for i in listed.data] == ids[:2]


async def test_conversation_with_previous_response_id_is_refused(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    conversation = await client.conversations.create()
    first = await client.responses.create(model="fake-chat", input="hi")
    body = {
        "model": "fake-chat",
        "input": "hi",
        "conversation": conversation.id,
        "previous_response_id": first.id,
    }
    refused = await http.post("/v1/responses", json=body)
    assert_openai_error(refused, 400, param="conversation", code="mutually_exclusive_parameters")
    refused = await http.post("/v1/responses", json={**body, "previous_response_id": None,
                                                     "conversation": {"id": 3}})  # fmt: skip
    assert_openai_error(refused, 400, param="conversation.id", code="invalid_value")


async def test_item_reference_resolves_the_callers_stored_items(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    first = await client.responses.create(model="fake-chat", input="Remember: blue.")
    answer, asked = first.output[0].id, (await client.responses.input_items.list(first.id)).data
    fake.reply = "Second answer."
    second = await client.responses.create(
        model="fake-chat",
        input=[
            {"type": "item_reference", "id": asked[0].id},
            {"type": "item_reference", "id": answer},
            said("Which colour?"),
        ],
    )
    prompt = fake.calls[-1].prompt
    assert prompt.index("Remember: blue.") < prompt.index("Hello from") < prompt.index("colour")
    listed = (await client.responses.input_items.list(second.id, order="asc")).data
    assert [i.id for i in listed[:2]] == [asked[0].id, answer]  # the items themselves
    # A conversation's item, and a bare {"id"} as OpenAI's type allows.
    conversation = await client.conversations.create(items=[said("From a conversation.")])
    (item,) = (await client.conversations.items.list(conversation.id)).data
    await client.responses.create(model="fake-chat", input=[{"id": item.id}, said("ok?")])  # type: ignore[list-item,typeddict-item]
    assert "From a conversation." in fake.calls[-1].prompt

    # Unknown, another key's, and deleted: the same 400 naming the item.
    other = sdk(http, (await new_key(http))["key"])
    await client.responses.delete(first.id)
    for caller, item_id in ((client, "msg_" + "0" * 48), (other, item.id), (client, answer)):
        calls = len(fake.calls)
        with pytest.raises(openai.BadRequestError) as caught:
            await caller.responses.create(
                model="fake-chat",
                input=[said("hi"), {"type": "item_reference", "id": item_id}],
            )
        assert caught.value.body["param"] == "input[1].id"  # type: ignore[index]
        assert caught.value.code == "item_not_found"
        assert len(fake.calls) == calls


async def _used(http: httpx.AsyncClient) -> int:
    return int((await http.get("/v1/me")).json()["storage"]["key"]["used_bytes"])


async def test_a_metadata_update_that_grows_a_conversation_is_refused_past_the_quota() -> None:
    most = {f"k{i:02}" + "k" * 61: "v" * 512 for i in range(16)}  # 9 KB, OpenAI's most
    async with serve(make_settings(stored_mb_per_key=0.005)) as (_, http, client):
        conversation = await client.conversations.create(items=[USER], metadata={"tag": "a"})
        before = await _used(http)
        refused = await http.post(f"/v1/conversations/{conversation.id}", json={"metadata": most})
        error = assert_openai_error(refused, 403, param="metadata", code="storage_quota_exceeded")
        assert "GATEWAY_STORED_MB_PER_KEY" in error["message"]
        assert (await client.conversations.retrieve(conversation.id)).metadata == {"tag": "a"}
        assert await _used(http) == before
        # What fits is taken; a smaller record gives its bytes back.
        await client.conversations.update(conversation.id, metadata={"tag": "b"})
        await client.conversations.update(conversation.id, metadata={})
        assert await _used(http) < before


async def test_a_delete_racing_a_change_wins(
    app: Any, client: openai.AsyncOpenAI, http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    store = app.state.services.conversations.store
    put, point = store.stored_bytes.put, store.index.point

    # The delete lands after the change read the conversation, before it counted it.
    conversation = await client.conversations.create(items=[USER])

    async def put_after_delete(*args: Any, **kwargs: Any) -> None:
        store.stored_bytes.put = put
        await client.conversations.delete(conversation.id)
        await put(*args, **kwargs)

    store.stored_bytes.put = put_after_delete
    with pytest.raises(openai.NotFoundError):
        await client.conversations.items.create(conversation.id, items=[said("x")])
    assert await _used(http) == 0

    # The delete lands after the change was written, before its items were indexed.
    conversation = await client.conversations.create(items=[USER])

    async def point_after_delete(*args: Any, **kwargs: Any) -> None:
        store.index.point = point
        await client.conversations.delete(conversation.id)
        await point(*args, **kwargs)

    store.index.point = point_after_delete
    await client.conversations.items.create(conversation.id, items=[said("y")])
    assert await _used(http) == 0
    with redis.Redis.from_url(redis_server.url) as raw:
        assert raw.keys("gw:item:*") == [] and raw.keys("gw:conversation:*") == []


async def test_a_background_response_counts_every_item_it_indexed(
    redis_server: EmbeddedRedis,
) -> None:
    async with serve(make_settings()) as (_, http, client):
        await _background_counts(client, http, redis_server)


async def _background_counts(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    # Stored several times as it runs (queued, in progress, each output item, done): each
    # save counts the index entries of all its items, not only those new at that save.
    created = await client.responses.create(
        model="fake-chat", input=[said(f"turn {i}") for i in range(100)], background=True
    )
    for _ in range(400):
        if (await client.responses.retrieve(created.id)).status == "completed":
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the background response never completed")
    where = f"response:{created.id}"
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as raw:
        keys = raw.keys("gw:item:*")
        entries = [(k, v) for k, v in zip(keys, raw.mget(keys), strict=True) if v == where]
        (record,) = raw.keys(f"gw:response:*{created.id}")
        stored = raw.strlen(record)
    assert len(entries) == 101  # its input and its answer
    indexed = sum(len(k) + len(v) + ENTRY_OVERHEAD for k, v in entries)
    assert await _used(http) >= stored + indexed + 2 * RECORD_OVERHEAD


async def test_a_response_saved_again_counts_the_same_entries(
    redis_server: EmbeddedRedis,
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        counted = StoredBytes(client)
        index = ItemIndex(client, counted)
        items = [{"id": f"msg_{i}"} for i in range(50)]

        async def used() -> int:
            return int((await counted.usage("o", None))["key"]["used_bytes"])

        await index.add_response("o", "response:r0", items[:10], 60)  # made them first
        first = await used()
        await index.add_response("o", "response:r1", items[:40], 60)
        await index.add_response("o", "response:r1", items, 60)  # the same response, grown
        ids = [str(item["id"]) for item in items[10:]]
        expected = first + entry_bytes("o", "response:r1", ids) + RECORD_OVERHEAD
        assert await used() == expected
        await index.add_response("o", "response:r1", items, 60)  # unchanged
        assert await used() == expected
    finally:
        await client.aclose()


async def test_item_references_are_located_in_one_round_trip(
    client: openai.AsyncOpenAI, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    conversation = await client.conversations.create(items=[said("one"), said("two")])
    items = (await client.conversations.items.list(conversation.id, order="asc")).data
    calls: list[object] = []
    locate = ItemIndex.locate

    async def counted(self: ItemIndex, *args: Any) -> Any:
        calls.append(args)
        return await locate(self, *args)

    monkeypatch.setattr(ItemIndex, "locate", counted)
    refs: Any = [{"type": "item_reference", "id": item.id} for item in items]
    await client.responses.create(model="fake-chat", input=[*refs, said("three")])
    assert fake.calls[-1].prompt.index("one") < fake.calls[-1].prompt.index("two")
    assert len(calls) == 1
