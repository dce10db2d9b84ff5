"""The Files and Batch APIs on the shared real stack (nginx, two replicas, Triton, Redis)
with the official SDK: a chat batch of 40 lines on mock_chat with one bad line (39 answers
in the output file, the bad one's 400 in the error file, the counts), an embeddings batch on
e5_small, a batch cancelled mid-way keeping what finished, and another key that sees none of
it. Both replicas' workers share the lines (each answer's request id is in its replica's
log; here: every line answered once)."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest

from tests.support.bodies import mock_say
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"


def chat_line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "mock_chat", "messages": [{"role": "user", "content": text}], **body},
    }


def start(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str = CHAT) -> Any:
    data = "\n".join(json.dumps(line) for line in lines).encode()
    uploaded = client.files.create(file=("batch.jsonl", data), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(data)
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )


def ended(client: openai.OpenAI, batch_id: str, wait_s: float = 120.0) -> Any:
    deadline = time.monotonic() + wait_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


@pytest.fixture(scope="module")
def client(stack: GatewayProcess) -> openai.OpenAI:
    key = stack.create_key("batches", models=["mock_chat", "e5_small"])["key"]
    return stack.client(key)


def test_a_chat_batch_of_40_lines_with_one_bad_line(client: openai.OpenAI) -> None:
    lines = [chat_line(f"q{i}", f"Say {i}. {mock_say(f'Answer {i}.')}") for i in range(40)]
    lines[13]["body"]["max_tokens"] = -1  # refused by the endpoint: this line's 400
    batch = ended(client, start(client, lines).id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (40, 39, 1)
    output = lines_of(client, batch.output_file_id)
    errors = lines_of(client, batch.error_file_id)
    assert len(output) == 39 and [e["custom_id"] for e in errors] == ["q13"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["param"] == "max_tokens"
    by_id = {o["custom_id"]: o["response"] for o in output}
    assert sorted(by_id) == sorted(f"q{i}" for i in range(40) if i != 13)
    for i in (0, 39):  # each answer is its own line's
        reply = by_id[f"q{i}"]
        assert reply["status_code"] == 200
        assert reply["body"]["choices"][0]["message"]["content"] == f"Answer {i}."
    assert batch.usage is not None and batch.usage.output_tokens == sum(
        r["body"]["usage"]["completion_tokens"] for r in by_id.values()
    )


def test_an_embeddings_batch(client: openai.OpenAI) -> None:
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "e5_small", "input": [f"passage: text number {i}"]},
        }
        for i in range(6)
    ]
    batch = ended(client, start(client, lines, "/v1/embeddings").id)
    assert batch.status == "completed" and batch.request_counts.completed == 6
    vectors = [
        o["response"]["body"]["data"][0]["embedding"]
        for o in lines_of(client, batch.output_file_id)
    ]
    assert len(vectors) == 6 and all(len(v) == 384 for v in vectors)


def test_cancel_mid_way_keeps_what_finished(client: openai.OpenAI) -> None:
    slow = "[mock:delay_ms=40] [mock:words=25] Tell me a story."
    batch = start(client, [chat_line(f"s{i}", slow) for i in range(60)])
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).request_counts.completed < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = ended(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert 2 <= done.request_counts.completed < 60
    assert len(lines_of(client, done.output_file_id)) == done.request_counts.completed


def test_another_key_sees_none_of_it(client: openai.OpenAI, stack: GatewayProcess) -> None:
    batch = start(client, [chat_line("only", "Hi")])
    other = stack.client(stack.create_key("someone else")["key"])
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(batch.input_file_id)
    assert all(b.id != batch.id for b in other.batches.list())
    assert all(f.id != batch.input_file_id for f in other.files.list())
    done = ended(client, batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(done.output_file_id or "")
