"""The Batch API on the fake backend with the official SDK: a batch's lines run through the
endpoints (validated there, under the key's allow-list, limits and budget, at the lowest
priority), one result per line in the output or error file, counts and usage; a file that
cannot run fails the batch with its lines named; cancel, expiry, another key, and a line
whose replica died answered exactly once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from gateway.backend.fake import FakeBackend
from gateway.serving.batches import worker as worker_module
from gateway.state.batches import BatchStore
from tests.support.inprocess import make_settings, new_key, sdk, serve

CHAT = "/v1/chat/completions"


@pytest.fixture
async def served(
    fake: FakeBackend,
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI]]:
    settings = make_settings(models=["fake-chat", "fake-embed"], batch_tick_s=0.02)
    async with serve(settings, fake) as running:
        yield running


def chat_line(custom_id: str, text: str = "Hi", **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": text}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "fake-chat", "messages": messages, **body},
    }


async def upload(client: openai.AsyncOpenAI, lines: list[Any]) -> str:
    data = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    made = await client.files.create(file=("batch.jsonl", data.encode()), purpose="batch")
    return made.id


async def run(
    client: openai.AsyncOpenAI, lines: list[Any], endpoint: str = CHAT
) -> openai.types.Batch:
    file_id = await upload(client, lines)
    batch = await client.batches.create(
        input_file_id=file_id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    return await ended(client, batch.id)


async def ended(client: openai.AsyncOpenAI, batch_id: str, wait_s: float = 20.0) -> Any:
    deadline = time.monotonic() + wait_s
    while True:
        batch = await client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, batch
        await asyncio.sleep(0.05)


async def answered(client: openai.AsyncOpenAI, batch_id: str, at_least: int) -> None:
    """Waits until the batch has answered ``at_least`` lines."""
    deadline = time.monotonic() + 20
    while True:
        counts = (await client.batches.retrieve(batch_id)).request_counts
        if counts is not None and counts.completed >= at_least:
            return
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def lines_of(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [json.loads(line) for line in content.text.splitlines() if line]


async def test_a_chat_batch_answers_every_line_once_and_a_bad_body_in_the_error_file(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI], fake: FakeBackend
) -> None:
    _, _, client = served
    lines = [chat_line(f"req-{i}", f"Question {i}") for i in range(40)]
    lines[7]["body"]["temperature"] = 5  # the endpoint refuses it: a 400 for this line only
    batch = await run(client, lines)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (40, 39)
    assert batch.request_counts.failed == 1
    assert batch.metadata == {"job": "nightly"} and batch.model == "fake-chat"
    output = await lines_of(client, batch.output_file_id)
    errors = await lines_of(client, batch.error_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(
        f"req-{i}" for i in range(40)
    )
    assert [e["custom_id"] for e in errors] == ["req-7"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["param"] == "temperature"
    reply = output[0]["response"]
    assert reply["status_code"] == 200 and reply["request_id"]
    assert reply["body"]["choices"][0]["message"]["content"]
    # Usage is the lines' own: 39 answers of the fake's reply.
    assert batch.usage is not None
    assert batch.usage.output_tokens == sum(
        r["response"]["body"]["usage"]["completion_tokens"] for r in output
    )
    # Every line reached the backend once, at the lowest priority.
    assert len(fake.calls) == 39
    files = await client.files.retrieve(batch.output_file_id or "")
    assert files.purpose == "batch_output"


async def test_an_embeddings_batch(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    app, _, client = served
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "fake-embed", "input": [f"text {i}", "more"]},
        }
        for i in range(5)
    ]
    batch = await run(client, lines, "/v1/embeddings")
    assert batch.status == "completed" and batch.request_counts.completed == 5
    output = await lines_of(client, batch.output_file_id)
    assert all(len(o["response"]["body"]["data"]) == 2 for o in output)
    # Once its files are written, its work leaves Redis; what is kept expires.
    redis = app.state.services.redis
    left = await redis.keys(f"gw:batch:{{{batch.id}}}:*")
    kept = {k.rsplit(":", 1)[1] for k in left}
    assert (
        {"rec", "status", "counts"}
        <= kept
        <= {"rec", "status", "times", "counts", "files", "finalizer"}
    )
    for k in left:
        assert await redis.ttl(k) > 0, k
    assert await redis.zscore("gw:batches:{admin}:live", batch.id) is None


@pytest.mark.parametrize(
    ("broken", "code", "line"),
    [
        (chat_line("req-0"), "duplicate_custom_id", 2),
        ({**chat_line("x"), "url": "/v1/embeddings"}, "invalid_url", 2),
        ({**chat_line("x"), "method": "GET"}, "invalid_method", 2),
        ({"custom_id": "x", "method": "POST", "url": CHAT, "body": {}}, "invalid_body", 2),
    ],
)
async def test_a_file_that_cannot_run_fails_the_batch_naming_its_line(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI],
    fake: FakeBackend,
    broken: Any,
    code: str,
    line: int,
) -> None:
    _, _, client = served
    batch = await run(client, [chat_line("req-0"), broken, chat_line("req-2")])
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data
    assert (batch.errors.data[0].code, batch.errors.data[0].line) == (code, line)
    assert fake.calls == []


async def test_every_line_names_the_same_model(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    _, _, client = served
    other = chat_line("b")
    other["body"]["model"] = "fake-other"
    batch = await run(client, [chat_line("a"), other])
    assert batch.status == "failed" and batch.errors.data[0].code == "mismatched_model"


async def test_another_key_sees_nothing_and_a_models_allow_list_applies(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    _, http, client = served
    batch = await run(client, [chat_line("a")])
    other = sdk(http, (await new_key(http))["key"])
    with pytest.raises(openai.NotFoundError):
        await other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        await other.batches.cancel(batch.id)
    assert (await other.batches.list()).data == []
    # Its input file is not the other key's to batch either.
    with pytest.raises(openai.NotFoundError):
        await other.batches.create(
            input_file_id=batch.input_file_id, endpoint=CHAT, completion_window="24h"
        )
    # A key that may use only fake-embed gets each chat line's 403 in the error file.
    narrow = sdk(http, (await new_key(http, models=["fake-embed"]))["key"])
    refused = await run(narrow, [chat_line("a"), chat_line("b")])
    assert refused.status == "completed" and refused.request_counts.failed == 2
    errors = await lines_of(narrow, refused.error_file_id)
    assert {e["response"]["status_code"] for e in errors} == {403}
    assert refused.output_file_id is None


async def test_cancel_stops_the_batch_and_keeps_what_finished(fake: FakeBackend) -> None:
    fake.whole_delay_s = 0.25
    settings = make_settings(batch_tick_s=0.02, batch_concurrency=2)
    async with serve(settings, fake) as (_, http, client):
        file_id = await upload(client, [chat_line(f"r{i}") for i in range(40)])
        batch = await client.batches.create(
            input_file_id=file_id, endpoint=CHAT, completion_window="24h"
        )
        await answered(client, batch.id, 2)
        # The operator sees it running, and the key its count.
        running = (await http.get("/admin/batches")).json()["data"]
        assert [(b["id"], b["owner"]) for b in running] == [(batch.id, "admin")]
        assert (await http.get("/v1/me")).json()["batches"] == {"live": 1, "limit": 8}
        cancelling = await client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at
        done = await ended(client, batch.id)
        assert done.status == "cancelled" and done.cancelled_at
        assert 2 <= done.request_counts.completed < 40
        output = await lines_of(client, done.output_file_id)
        assert len(output) == done.request_counts.completed
        # A running line was stopped as a client that leaves stops its request.
        assert any(call.cancelled for call in fake.calls)
        assert (await client.batches.cancel(batch.id)).status == "cancelled"  # as it ended
        # The audit log has who made it and who cancelled it.
        log = (await http.get("/admin/audit")).json()["data"]
        done_entries = {(e["action"], e["target"]) for e in log if e["stage"] == "completed"}
        assert {("batch.create", batch.id), ("batch.cancel", batch.id)} <= done_entries


async def test_a_batch_that_ended_cannot_be_cancelled(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    _, _, client = served
    batch = await run(client, [chat_line("a")])
    with pytest.raises(openai.BadRequestError) as refused:
        await client.batches.cancel(batch.id)
    assert refused.value.code == "batch_not_cancellable"


async def test_a_batch_past_its_window_expires_keeping_what_finished(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI], fake: FakeBackend
) -> None:
    app, _, client = served
    fake.whole_delay_s = 0.25
    file_id = await upload(client, [chat_line(f"r{i}") for i in range(30)])
    batch = await client.batches.create(
        input_file_id=file_id, endpoint=CHAT, completion_window="24h"
    )
    await answered(client, batch.id, 1)
    redis = app.state.services.redis
    key = f"gw:batch:{{{batch.id}}}:rec"
    record = json.loads(await redis.get(key))
    record["expires_at"] = int(time.time()) - 1
    await redis.set(key, json.dumps(record), keepttl=True)
    done = await ended(client, batch.id)
    assert done.status == "expired" and done.expired_at
    assert done.request_counts.completed + done.request_counts.failed == 30
    errors = await lines_of(client, done.error_file_id)
    assert errors and {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert len(await lines_of(client, done.output_file_id)) == done.request_counts.completed


async def test_lines_of_a_replica_that_died_are_answered_once(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI], fake: FakeBackend
) -> None:
    app, _, client = served
    fake.whole_delay_s = 0.1
    file_id = await upload(client, [chat_line(f"r{i}") for i in range(12)])
    # A replica that claims lines and dies: its leases end and another answers them.
    services = app.state.services
    worker = services.batch_worker
    await worker.close()
    batch = await client.batches.create(
        input_file_id=file_id, endpoint=CHAT, completion_window="24h"
    )
    dead = BatchStore(services.redis)
    claimed = await dead.claim(batch.id, 5, lease_s=0.3)
    assert len(claimed) == 5
    worker.start(app)
    done = await ended(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 12
    output = await lines_of(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"r{i}" for i in range(12))
    assert len(fake.calls) == 12  # each line generated once
    # A second result for a line already answered is dropped.
    assert await dead.finish(batch.id, claimed[0].index, True, "{}", (0, 0, 0), 1 << 20, "{}") == -1


async def test_the_lines_run_at_the_lowest_priority(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI], fake: FakeBackend
) -> None:
    _, _, client = served
    batch = await run(client, [chat_line("a", priority=-5), chat_line("b")])
    assert batch.request_counts.completed == 2
    assert {call.priority for call in fake.calls} == {100}


async def test_a_batchs_results_are_bounded(fake: FakeBackend) -> None:
    """What a batch keeps in Redis for its output is at most GATEWAY_MAX_FILE_MB: past it,
    each answer is dropped for a short error line."""
    settings = make_settings(batch_tick_s=0.02, max_file_mb=0.001)  # 1 KiB
    async with serve(settings, fake) as (_, _, client):
        batch = await run(client, [chat_line(f"r{i}") for i in range(5)])
        assert batch.status == "completed"
        errors = await lines_of(client, batch.error_file_id)
        assert errors and {e["error"]["code"] for e in errors} == {"batch_output_too_large"}
        output = await lines_of(client, batch.output_file_id)
        assert len(output) + len(errors) == 5 and len(output) < 5
        assert batch.request_counts.failed == len(errors)


async def test_a_large_batch_does_not_hold_every_slot(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI], fake: FakeBackend
) -> None:
    """Two keys' batches on one model share its slots: the small one ends long before the
    large one, which would have held them all."""
    _, http, client = served
    fake.whole_delay_s = 0.05
    large = await client.batches.create(
        input_file_id=await upload(client, [chat_line(f"a{i}") for i in range(80)]),
        endpoint=CHAT,
        completion_window="24h",
    )
    other = sdk(http, (await new_key(http))["key"])
    small = await run(other, [chat_line("b")])
    assert small.status == "completed"
    assert (await client.batches.retrieve(large.id)).status == "in_progress"
    await ended(client, large.id)


async def test_the_files_bytes_gauge_follows_uploads_results_and_deletes(
    served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, http, client = served
    monkeypatch.setattr(worker_module, "FILES_GAUGE_S", 0.0)  # read every tick, not every 10 s

    async def gauge_becomes(check: Any) -> float:
        deadline = time.monotonic() + 10
        while True:
            text = (await http.get("/metrics")).text
            found = [line for line in text.splitlines() if line.startswith("gateway_files_bytes ")]
            value = float(found[0].split()[1]) if found else 0.0
            if check(value):
                return value
            assert time.monotonic() < deadline, value
            await asyncio.sleep(0.02)

    before = await gauge_becomes(lambda _: True)
    file_id = await upload(client, [chat_line("a"), chat_line("b")])
    size = (await client.files.retrieve(file_id)).bytes
    uploaded = await gauge_becomes(lambda v: v >= before + size)
    batch = await client.batches.create(
        input_file_id=file_id, endpoint=CHAT, completion_window="24h"
    )
    done = await ended(client, batch.id)
    results = (await client.files.retrieve(done.output_file_id or "")).bytes
    with_results = await gauge_becomes(lambda v: v >= uploaded + results)
    await client.files.delete(file_id)
    await client.files.delete(done.output_file_id or "")
    await gauge_becomes(lambda v: v <= with_results - size - results)
