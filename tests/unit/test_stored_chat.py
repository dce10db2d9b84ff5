"""Stored chat completions (``store: true``), through the official SDK against the app with
the fake backend and a real Redis: what is stored, listed, filtered, paginated, updated,
deleted, and what is refused."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio

from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.chat_completions import ChatCompletionStore, StoredChatCompletion
from gateway.state.stored_bytes import RECORD_OVERHEAD
from tests.support.backends import long_model
from tests.support.bodies import USER_HI, assert_openai_error, chat_body, sse_json
from tests.support.inprocess import REPLY, make_settings, new_key, sdk, serve
from tests.support.shapes import CALL, WEATHER


async def test_a_stored_completion_is_retrieved_with_its_metadata_and_messages(
    client: openai.AsyncOpenAI,
) -> None:
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
        },
    ]
    made = await client.chat.completions.create(
        model="fake-chat", messages=messages, store=True, metadata={"topic": "greeting"}
    )
    stored = await client.chat.completions.retrieve(made.id)
    assert stored.id == made.id and stored.metadata == {"topic": "greeting"}
    assert stored.choices[0].message.content == REPLY == made.choices[0].message.content
    assert stored.usage == made.usage and stored.created == made.created
    page = await client.chat.completions.messages.list(made.id)
    assert [m.id for m in page.data] == [f"{made.id}-0", f"{made.id}-1"]
    system, user = page.data
    assert (system.role, system.content, system.content_parts) == ("system", "Be brief.", None)
    assert user.content == "Hi\n!"
    assert [p.text for p in user.content_parts or []] == ["Hi", "!"]  # type: ignore[union-attr]


async def test_nothing_is_stored_without_store_true_and_metadata_alone_is_accepted(
    client: openai.AsyncOpenAI,
) -> None:
    plain = await client.chat.completions.create(model="fake-chat", messages=USER_HI)
    unstored = await client.chat.completions.create(
        model="fake-chat", messages=USER_HI, store=False, metadata={"k": "v"}
    )
    for made in (plain, unstored):
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.retrieve(made.id)
    assert (await client.chat.completions.list()).data == []


async def _store(client: openai.AsyncOpenAI, model: str = "fake-chat", **metadata: str) -> str:
    made = await client.chat.completions.create(
        model=model, messages=USER_HI, store=True, metadata=metadata
    )
    return made.id


async def test_list_filters_by_model_and_metadata_and_paginates_in_order(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    ids = [await _store(client, user="ann", run=str(i)) for i in range(5)]
    other_model = await _store(client, "fake-plain", user="ann")
    other_user = await _store(client, user="bob")
    everything = [c.id async for c in client.chat.completions.list(limit=2)]
    assert everything == [*ids, other_model, other_user]  # oldest first, every page
    newest = await client.chat.completions.list(order="desc", limit=3)
    assert [c.id for c in newest.data] == [other_user, other_model, ids[4]] and newest.has_more
    anns = await client.chat.completions.list(model="fake-chat", metadata={"user": "ann"}, limit=3)
    assert [c.id for c in anns.data] == ids[:3] and anns.has_more
    rest = await client.chat.completions.list(
        model="fake-chat", metadata={"user": "ann"}, after=ids[2], limit=3
    )
    assert [c.id for c in rest.data] == ids[3:] and not rest.has_more
    both = await client.chat.completions.list(metadata={"user": "ann", "run": "1"})
    assert [c.id for c in both.data] == [ids[1]]
    assert [c.id for c in (await client.chat.completions.list(model="fake-plain")).data] == [
        other_model
    ]


async def test_update_replaces_the_metadata_and_delete_removes_it(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    made = await _store(client, user="ann", tag="a")
    updated = await client.chat.completions.update(made, metadata={"tag": "b"})
    assert updated.metadata == {"tag": "b"}
    assert (await client.chat.completions.retrieve(made)).metadata == {"tag": "b"}
    assert (await client.chat.completions.list(metadata={"tag": "a"})).data == []
    assert [c.id for c in (await client.chat.completions.list(metadata={"tag": "b"})).data] == [
        made
    ]
    assert (await client.chat.completions.update(made, metadata=None)).metadata == {}
    deleted = await client.chat.completions.delete(made)
    assert (deleted.id, deleted.object, deleted.deleted) == (
        made,
        "chat.completion.deleted",
        True,
    )
    for call in (
        http.get(f"/v1/chat/completions/{made}"),
        http.delete(f"/v1/chat/completions/{made}"),
        http.post(f"/v1/chat/completions/{made}", json={"metadata": {"k": "v"}}),
        http.get(f"/v1/chat/completions/{made}/messages"),
    ):
        assert_openai_error(await call, 404, param="completion_id", code="not_found")
    assert (await client.chat.completions.list()).data == []


async def test_another_keys_completion_does_not_exist_for_a_caller(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    made = await _store(client, user="ann")
    other = sdk(http, (await new_key(http))["key"])
    with pytest.raises(openai.NotFoundError):
        await other.chat.completions.retrieve(made)
    with pytest.raises(openai.NotFoundError):
        await other.chat.completions.update(made, metadata={"k": "v"})
    with pytest.raises(openai.NotFoundError):
        await other.chat.completions.delete(made)
    assert (await other.chat.completions.list()).data == []
    with pytest.raises(openai.BadRequestError):  # not one of its own to page after
        await other.chat.completions.list(after=made)
    assert (await client.chat.completions.retrieve(made)).id == made


async def test_a_streamed_completion_is_stored_as_the_client_received_it(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    async with client.chat.completions.stream(
        model="fake-chat", messages=USER_HI, n=2, logprobs=True, store=True
    ) as stream:
        final = await stream.get_final_completion()
    stored = await client.chat.completions.retrieve(final.id)
    assert len(stored.choices) == 2
    for got, seen in zip(stored.choices, final.choices, strict=True):
        assert got.message.content == seen.message.content == REPLY
        assert got.finish_reason == seen.finish_reason == "stop"
        assert got.logprobs and seen.logprobs
        assert got.logprobs.content == seen.logprobs.content
    assert stored.usage is not None and stored.usage.completion_tokens > 0
    # The client did not ask for usage: its chunks are those of a stream without it.
    raw = await http.post("/v1/chat/completions", json=chat_body(stream=True, store=True))
    chunks = sse_json(raw.text)
    assert chunks and all("usage" not in chunk and chunk["choices"] for chunk in chunks)
    assert (await client.chat.completions.retrieve(chunks[0]["id"])).usage is not None
    # With usage asked for, the stream carries it and the record has the same.
    asked = await http.post(
        "/v1/chat/completions",
        json=chat_body(stream=True, store=True, stream_options={"include_usage": True}),
    )
    last = sse_json(asked.text)[-1]
    assert last["usage"] == (await http.get(f"/v1/chat/completions/{last['id']}")).json()["usage"]


async def test_streamed_tool_calls_are_stored_as_calls(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.reply = CALL
    async with client.chat.completions.stream(
        model="fake-chat", messages=USER_HI, tools=[WEATHER], store=True
    ) as stream:
        final = await stream.get_final_completion()
    stored = (await client.chat.completions.retrieve(final.id)).choices[0]
    assert stored.finish_reason == final.choices[0].finish_reason == "tool_calls"
    assert stored.message.content is None
    [call] = stored.message.tool_calls or []
    assert call.id == final.choices[0].message.tool_calls[0].id  # type: ignore[index]
    assert (call.function.name, json.loads(call.function.arguments)) == (  # type: ignore[union-attr]
        "get_weather",
        {"city": "Paris"},
    )


async def test_messages_paginate_in_both_orders(client: openai.AsyncOpenAI) -> None:
    turns: Any = [{"role": "user", "content": f"turn {i}"} for i in range(5)]
    made = await client.chat.completions.create(model="fake-chat", messages=turns, store=True)
    seen = [m.content async for m in client.chat.completions.messages.list(made.id, limit=2)]
    assert seen == [f"turn {i}" for i in range(5)]
    newest = await client.chat.completions.messages.list(made.id, order="desc", limit=2)
    assert [m.content for m in newest.data] == ["turn 4", "turn 3"] and newest.has_more
    after = await client.chat.completions.messages.list(made.id, order="desc", after=f"{made.id}-1")
    assert [m.content for m in after.data] == ["turn 0"] and not after.has_more


async def test_metadata_is_bounded_as_openai_bounds_it(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    most = {f"k{i:02}" + "k" * 61: "v" * 512 for i in range(16)}
    made = await _store(client, **most)
    assert (await client.chat.completions.retrieve(made)).metadata == most
    for metadata in ({**most, "one": "more"}, {"k" * 65: "v"}, {"k": "v" * 513}):
        before = len(fake.calls)
        reply = await http.post(
            "/v1/chat/completions", json=chat_body(store=True, metadata=metadata)
        )
        assert assert_openai_error(reply, 400)["param"].startswith("metadata")
        update = await http.post(f"/v1/chat/completions/{made}", json={"metadata": metadata})
        assert assert_openai_error(update, 400)["param"].startswith("metadata")
        assert len(fake.calls) == before


async def test_a_completion_too_large_to_store_is_refused_before_generating(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    settings_kb = Settings.model_fields["max_stored_kb"].default
    content = "x" * settings_kb * 1024
    body = chat_body(
        model=long_model(fake), store=True, messages=[{"role": "user", "content": content}]
    )
    error = assert_openai_error(
        await http.post("/v1/chat/completions", json=body),
        400,
        param="store",
        code="stored_record_too_large",
    )
    assert "GATEWAY_MAX_STORED_KB" in error["message"]
    assert fake.calls == []


async def test_an_answer_too_large_to_store_ends_the_stream_with_an_error(
    http: httpx.AsyncClient, fake: FakeBackend, client: openai.AsyncOpenAI
) -> None:
    fake.reply = " ".join(["y" * 99] * 100)  # 10 KB of answer on 1015 KB of messages
    content = "x" * 1015 * 1024
    body = chat_body(
        model=long_model(fake), store=True, messages=[{"role": "user", "content": content}]
    )
    assert_openai_error(await http.post("/v1/chat/completions", json=body), 400, param="store")
    events = sse_json((await http.post("/v1/chat/completions", json={**body, "stream": True})).text)
    assert events[-1]["error"]["code"] == "stored_record_too_large"
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.retrieve(events[0]["id"])


async def test_a_key_keeps_at_most_its_count_of_stored_completions() -> None:
    fake = FakeBackend()
    async with serve(make_settings(max_stored_chat_completions=2), fake) as (_, http, client):
        await _at_most_two(client, http, fake)


async def _at_most_two(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    first = await _store(client)
    await _store(client)
    calls = len(fake.calls)
    full = await http.post("/v1/chat/completions", json=chat_body(store=True))
    error = assert_openai_error(full, 403, param="store", code="storage_quota_exceeded")
    assert "GATEWAY_MAX_STORED_CHAT_COMPLETIONS" in error["message"]
    assert len(fake.calls) == calls
    assert (await http.post("/v1/chat/completions", json=chat_body())).status_code == 200
    await client.chat.completions.delete(first)
    await _store(client)


async def test_stored_completions_count_in_the_key_quota_and_deleting_gives_it_back() -> None:
    async with serve(make_settings(stored_mb_per_key=0.01)) as (_, http, client):
        await _quota(client, http)


async def _quota(client: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    # 10 KB: two records of 3 KB of messages (4.5 KB counted each) fit, a third does not.
    body = chat_body(store=True, messages=[{"role": "user", "content": "x" * 3000}])
    made = [(await http.post("/v1/chat/completions", json=body)).json()["id"] for _ in range(2)]
    used = (await http.get("/v1/me")).json()["storage"]["key"]["used_bytes"]
    assert used > 6000
    assert_openai_error(
        await http.post("/v1/chat/completions", json=body), 403, code="storage_quota_exceeded"
    )
    await client.chat.completions.delete(made[0])
    assert (await http.get("/v1/me")).json()["storage"]["key"]["used_bytes"] < used
    assert (await http.post("/v1/chat/completions", json=body)).status_code == 200


async def test_audio_cannot_be_stored(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    body = chat_body(
        store=True, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}
    )
    assert_openai_error(
        await http.post("/v1/chat/completions", json=body),
        400,
        param="store",
        code="unsupported_parameter",
    )
    assert fake.calls == []


async def test_expired_completions_leave_the_list(redis_server: EmbeddedRedis) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        store = ChatCompletionStore(client, ttl_s=1)
        for n in range(3):
            completion = {"id": f"chatcmpl-{n}", "model": "m", "metadata": {}}
            await store.save(StoredChatCompletion(owner="o", completion=completion, messages=[]))
        assert len((await store.list("o")).records) == 3
        await asyncio.sleep(1.1)
        page = await store.list("o")
        assert page.records == [] and not page.has_more
        assert await client.zcard(store._index("o")) == 0  # trimmed, not only skipped
        assert await client.hlen(store._summaries("o")) == 0
    finally:
        await client.aclose()


#: The most metadata OpenAI allows: 16 pairs of 64-character keys and 512-character values.
MOST = {f"k{i:02}" + "k" * 61: "v" * 512 for i in range(16)}


def _record_keys(raw: redis.Redis) -> list[str]:
    """The Redis keys of stored completions' records (not their index or summaries)."""
    keys = [k.decode() for k in raw.keys("gw:chatcmpl:*")]
    return [k for k in keys if not k.endswith((":index", ":summaries"))]


async def test_a_metadata_update_that_grows_a_record_is_refused_past_the_quota(
    redis_server: EmbeddedRedis,
) -> None:
    async with serve(make_settings(stored_mb_per_key=0.006)) as (_, http, client):
        made = await _store(client, tag="a")
        await _store(client)

        async def used() -> int:
            return int((await http.get("/v1/me")).json()["storage"]["key"]["used_bytes"])

        before = await used()
        refused = await http.post(f"/v1/chat/completions/{made}", json={"metadata": MOST})
        error = assert_openai_error(refused, 403, param="metadata", code="storage_quota_exceeded")
        assert "GATEWAY_STORED_MB_PER_KEY" in error["message"]
        assert (await client.chat.completions.retrieve(made)).metadata == {"tag": "a"}
        assert await used() == before
        # What fits is taken, and a smaller record gives its bytes back.
        assert (await client.chat.completions.update(made, metadata={"tag": "b"})).metadata
        assert (await client.chat.completions.update(made, metadata=None)).metadata == {}
        assert await used() < before


async def test_the_summary_the_list_reads_is_small_and_counted(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, redis_server: EmbeddedRedis
) -> None:
    made = await _store(client, **MOST)
    used = (await http.get("/v1/me")).json()["storage"]["key"]["used_bytes"]
    with redis.Redis.from_url(redis_server.url) as raw:
        (record,) = _record_keys(raw)
        (summaries,) = raw.keys("gw:chatcmpl:*:summaries")
        summary = raw.hstrlen(summaries, made)
        assert used >= raw.strlen(record) + RECORD_OVERHEAD + summary
    # A filter reads about 300 bytes per completion, not its 9 KB of metadata.
    assert 0 < summary < 400
    (key, value), *_ = MOST.items()
    found = await client.chat.completions.list(metadata={key: value}, model="fake-chat")
    assert [c.id for c in found.data] == [made]
    for metadata in ({key: value + "x"}, {key + "x": value}, {key: value, "k": "v"}):
        assert (await client.chat.completions.list(metadata=metadata)).data == []


@pytest.mark.parametrize("name", ["index", "summaries", "rec:x", "chatcmpl-1:rec"])
async def test_only_the_gateways_ids_name_a_stored_completion(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, name: str
) -> None:
    made = await _store(client, tag="a")
    for call in (
        http.get(f"/v1/chat/completions/{name}"),
        http.post(f"/v1/chat/completions/{name}", json={"metadata": {"k": "v"}}),
        http.delete(f"/v1/chat/completions/{name}"),
        http.get(f"/v1/chat/completions/{name}/messages"),
    ):
        assert_openai_error(await call, 404, param="completion_id", code="not_found")
    # The key's list, its filters and its count are whole.
    assert [c.id for c in (await client.chat.completions.list(metadata={"tag": "a"})).data] == [
        made
    ]
    assert (await client.chat.completions.retrieve(made)).metadata == {"tag": "a"}
