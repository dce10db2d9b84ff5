"""Background responses (``background: true``) in-process, on the fake backend: queued at
once and stored as they run, retrieved, followed from a sequence number, cancelled (the
backend's work with them), bounded per key, and ``failed`` when their replica's lease
ended (never ``in_progress`` for ever)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.state.responses import ResponseStore, StoredResponse
from gateway.state.stored_bytes import counter_keys
from tests.support.bodies import assert_openai_error
from tests.support.inprocess import REPLY, bearer, make_settings, new_key, sdk, serve


async def _until_status(client: openai.AsyncOpenAI, response_id: str, *statuses: str) -> Any:
    for _ in range(400):
        response = await client.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        await asyncio.sleep(0.01)
    raise AssertionError(f"{response_id} never reached {statuses}: {response.status}")


async def test_a_background_response_is_queued_at_once_then_completed(
    client: openai.AsyncOpenAI,
) -> None:
    created = await client.responses.create(model="fake-chat", input="Hi", background=True)
    assert created.status == "queued"
    assert created.background is True
    assert created.output == []
    done = await _until_status(client, created.id, "completed")
    assert done.output_text == REPLY
    assert done.background is True
    assert done.usage is not None and done.usage.output_tokens > 0
    # Finished: cancel returns it unchanged.
    again = await client.responses.cancel(created.id)
    assert again.status == "completed"
    assert again.output_text == REPLY


async def test_background_needs_store(http: httpx.AsyncClient) -> None:
    body = {"model": "fake-chat", "input": "Hi", "background": True, "store": False}
    response = await http.post("/v1/responses", json=body)
    assert_openai_error(response, 400, param="store", code="background_requires_store")


async def test_cancel_stops_the_generation_and_stores_it_cancelled(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    fake.token_delay_s = 0.05
    created = await client.responses.create(
        model="fake-chat", input="Hi", background=True, max_output_tokens=200
    )
    await _until_status(client, created.id, "in_progress")
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert fake.calls[-1].cancelled, "the backend's generation was not cancelled"
    assert (await client.responses.retrieve(created.id)).status == "cancelled"
    # Cancelling again returns it as it is.
    assert (await client.responses.cancel(created.id)).status == "cancelled"


async def test_only_a_background_response_can_be_cancelled_or_streamed_again(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    plain = await client.responses.create(model="fake-chat", input="Hi")
    response = await http.post(f"/v1/responses/{plain.id}/cancel")
    assert_openai_error(response, 400, param="response_id", code="response_not_cancellable")
    response = await http.get(f"/v1/responses/{plain.id}", params={"stream": "true"})
    assert_openai_error(response, 400, param="stream", code="not_background")


async def test_stream_then_replay_from_a_sequence_number(client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(
        model="fake-chat", input="Hi", background=True, stream=True
    )
    live = [event async for event in stream]
    numbers = [event.sequence_number for event in live]
    assert numbers == list(range(len(live)))
    assert live[0].type == "response.created"
    assert live[-1].type == "response.completed"
    response_id = live[-1].response.id
    replay = await client.responses.retrieve(response_id, stream=True, starting_after=2)
    again = [event async for event in replay]
    assert [e.model_dump() for e in again] == [e.model_dump() for e in live[3:]]
    assert (await client.responses.retrieve(response_id)).output_text == REPLY


async def test_another_key_sees_none_of_it(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    created = await client.responses.create(model="fake-chat", input="Hi", background=True)
    other = sdk(http, (await new_key(http))["key"])
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.cancel(created.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(created.id, stream=True)
    await _until_status(client, created.id, "completed")


@pytest.fixture
def settings() -> Settings:
    return make_settings(max_background_per_key=1)


async def test_running_background_responses_are_bounded_per_key(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.token_delay_s = 0.05
    first = await client.responses.create(
        model="fake-chat", input="Hi", background=True, max_output_tokens=200
    )
    body = {"model": "fake-chat", "input": "Hi", "background": True}
    response = await http.post("/v1/responses", json=body)
    error = assert_openai_error(response, 429, code="too_many_background_responses")
    assert error["param"] == "background"
    # Another key has its own bound.
    other = sdk(http, (await new_key(http))["key"])
    theirs = await other.responses.create(model="fake-chat", input="Hi", background=True)
    await other.responses.cancel(theirs.id)
    await client.responses.cancel(first.id)
    fake.token_delay_s = 0.0
    second = await client.responses.create(model="fake-chat", input="Hi", background=True)
    assert (await _until_status(client, second.id, "completed")).output_text == REPLY


async def _orphan(app: FastAPI, status: str = "in_progress") -> StoredResponse:
    """A background response stored ``status`` whose replica never renewed a lease (it
    died): what a reader finds after a crash."""
    store: ResponseStore = app.state.services.responses.store
    response = {
        "id": "resp_orphan",
        "object": "response",
        "created_at": 1,
        "status": status,
        "background": True,
        "error": None,
        "model": "fake-chat",
        "output": [],
    }
    stored = StoredResponse(owner="admin", response=response, input_items=[], messages=[])
    await store.save(stored)
    return stored


async def test_a_response_whose_replica_died_reads_failed_once_and_for_all(
    app: FastAPI, client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    await _orphan(app)
    failed = await client.responses.retrieve("resp_orphan")
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.error.model_dump()["code"] == "background_worker_lost"
    # Stored so: a later read, and a cancel, find it failed.
    assert (await client.responses.retrieve("resp_orphan")).status == "failed"
    assert (await client.responses.cancel("resp_orphan")).status == "failed"
    # Its followers are told, and the stream ends.
    events = [e async for e in await client.responses.retrieve("resp_orphan", stream=True)]
    assert [e.type for e in events] == ["error", "response.failed"]
    assert events[1].model_dump()["response"]["error"]["code"] == "background_worker_lost"


async def test_a_follower_of_a_dead_replicas_response_ends_with_its_failure(
    app: FastAPI, client: openai.AsyncOpenAI
) -> None:
    await _orphan(app, "queued")
    events = [e async for e in await client.responses.retrieve("resp_orphan", stream=True)]
    assert [e.type for e in events] == ["error", "response.failed"]


async def test_its_tokens_count_in_usage_and_its_tokens_are_reserved_before_it_is_queued(
    http: httpx.AsyncClient,
) -> None:
    created = await new_key(http)
    client = sdk(http, created["key"])
    started = await client.responses.create(model="fake-chat", input="Hi", background=True)
    done = await _until_status(client, started.id, "completed")
    assert done.usage is not None
    for _ in range(100):  # settled as the run ends, just after it is stored
        usage = (await http.get(f"/admin/keys/{created['id']}/usage")).json()
        if usage["completion_tokens"]:
            break
        await asyncio.sleep(0.01)
    assert usage["completion_tokens"] == done.usage.output_tokens
    assert usage["prompt_tokens"] == done.usage.input_tokens
    # A key whose token window cannot hold the request is refused at the POST.
    tight = await new_key(http, tpm=5)
    body = {"model": "fake-chat", "input": "Hi", "background": True, "max_output_tokens": 50}
    response = await http.post("/v1/responses", json=body, headers=bearer(tight["key"]))
    assert_openai_error(response, 429)


async def _slow_turn(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch, delay_s: float
) -> asyncio.Event:
    """Makes the step between a run's claim of its end and the storing of it (appending
    the turn to its conversation) last ``delay_s``; the event is set as it begins."""
    references = app.state.services.responses.references
    append_turn = references.append_turn
    entered = asyncio.Event()

    async def slow(*args: Any) -> None:
        entered.set()
        await asyncio.sleep(delay_s)
        await append_turn(*args)

    monkeypatch.setattr(references, "append_turn", slow)
    return entered


async def test_its_own_lease_watcher_does_not_stop_it_while_it_stores_its_end(
    app: FastAPI, client: openai.AsyncOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Longer than a renewal (0.5 s): the watcher renews while the end is claimed, not stored.
    await _slow_turn(app, monkeypatch, 0.7)
    created = await client.responses.create(model="fake-chat", input="Hi", background=True)
    done = await _until_status(client, created.id, "completed", "failed")
    assert done.status == "completed", done.error
    assert done.output_text == REPLY


async def test_a_cancel_that_comes_after_it_finished_leaves_it_completed(
    app: FastAPI, client: openai.AsyncOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered = await _slow_turn(app, monkeypatch, 0.3)
    created = await client.responses.create(model="fake-chat", input="Hi", background=True)
    await asyncio.wait_for(entered.wait(), 5)  # its end is claimed: completed
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "completed"
    assert cancelled.output_text == REPLY
    assert (await client.responses.retrieve(created.id)).status == "completed"


async def test_a_conversation_that_overflows_at_its_end_stores_it_failed_with_the_cause(
    fake: FakeBackend,
) -> None:
    async with serve(make_settings(max_conversation_items=20), fake) as (_, _, client):
        # 19 of its 20 items: room for the question, not for the answer too.
        said = {"type": "message", "role": "user", "content": "hello"}
        conversation = await client.conversations.create(items=[said] * 19)  # type: ignore[list-item]
        created = await client.responses.create(
            model="fake-chat", input="Hi", conversation=conversation.id, background=True
        )
        failed = await _until_status(client, created.id, "completed", "failed")
        assert failed.status == "failed"
        assert failed.error is not None
        assert failed.error.model_dump()["code"] == "too_many_items"
        events = [e async for e in await client.responses.retrieve(created.id, stream=True)]
        assert [e.type for e in events[-2:]] == ["error", "response.failed"]
        items = await client.conversations.items.list(conversation.id)
        assert len(items.data) == 19  # nothing appended


async def test_a_keys_max_concurrency_bounds_its_background_responses(fake: FakeBackend) -> None:
    fake.token_delay_s = 0.05
    async with serve(make_settings(), fake) as (_, http, _client):
        key = await new_key(http, max_concurrency=2)
        client = sdk(http, key["key"])
        started = [
            await client.responses.create(
                model="fake-chat", input="Hi", background=True, max_output_tokens=200
            )
            for _ in range(2)
        ]
        body = {"model": "fake-chat", "input": "Hi", "background": True}
        response = await http.post("/v1/responses", json=body, headers=bearer(key["key"]))
        error = assert_openai_error(response, 429, code="too_many_background_responses")
        assert error["param"] == "background"
        assert "max_concurrency" in error["message"]
        for response_id in started:
            await client.responses.cancel(response_id.id)


async def test_a_delete_on_another_replica_is_not_undone_by_the_run(
    fake: FakeBackend, http: httpx.AsyncClient
) -> None:
    key = await new_key(http)
    fake.reply = " ".join(["word"] * 12)
    fake.token_delay_s = 0.02  # about 0.25 s: ends before the replica's next renewal
    async with (
        serve(make_settings(), fake) as (first, first_http, _),
        serve(make_settings(), FakeBackend()) as (_, second_http, _),
    ):
        runs, deletes = sdk(first_http, key["key"]), sdk(second_http, key["key"])
        created = await runs.responses.create(model="fake-chat", input="Hi", background=True)
        await _until_status(runs, created.id, "in_progress")
        await deletes.responses.delete(created.id)
        background = first.state.services.background
        for _ in range(300):  # the run sees it deleted (at its next event), and ends
            if not background.running():
                break
            await asyncio.sleep(0.01)
        assert not background.running()
        assert fake.calls[-1].cancelled, "the run went on after it was deleted"
        for client in (runs, deletes):
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(created.id)
        redis_client = first.state.services.redis
        left = await redis_client.keys(f"*{created.id}*")
        # Neither its record nor its log is left (its end stays, "deleted"; the index
        # entries of its items stay until they expire, naming a record that is gone).
        assert [k for k in left if ":end:" not in k and ":item:" not in k] == []
        counted = await redis_client.hkeys(counter_keys("key", key["id"])[1])
        assert [e for e in counted if created.id in e and not e.startswith("items:")] == []


async def test_a_stopping_replica_stores_its_running_responses_failed(
    fake: FakeBackend, http: httpx.AsyncClient
) -> None:
    key = await new_key(http)
    fake.token_delay_s = 0.05
    async with serve(make_settings(), fake) as (_, stopping_http, _):
        client = sdk(stopping_http, key["key"])
        created = await client.responses.create(
            model="fake-chat", input="Hi", background=True, max_output_tokens=200
        )
        await _until_status(client, created.id, "in_progress")
    # The replica stopped: its run was stopped with it, stored failed, its usage settled.
    assert fake.calls[-1].cancelled
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("background ")]
    client = sdk(http, key["key"])
    failed = await client.responses.retrieve(created.id)
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.error.model_dump()["code"] == "server_shutdown"
    events = [e async for e in await client.responses.retrieve(created.id, stream=True)]
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    usage = (await http.get(f"/admin/keys/{key['id']}/usage")).json()
    assert usage["prompt_tokens"] > 0


async def test_starting_after_past_any_sequence_number_is_a_400(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    created = await client.responses.create(model="fake-chat", input="Hi", background=True)
    await _until_status(client, created.id, "completed")
    params = {"stream": "true", "starting_after": str(2**64 - 1)}
    response = await http.get(f"/v1/responses/{created.id}", params=params)
    assert_openai_error(response, 400, param="starting_after", code="invalid_value")
