"""Today's agents API benchmark: what stateless turns, sealed reasoning, background
responses, conversations, stored chat completions and ``truncation: "auto"`` cost.

Run with ``make bench`` (or ``python -m tests.bench.stateless``). It starts the real stack
on free ports (one gateway replica, no nginx, ``mock_chat`` and the reasoning stand-in
``mock_qwen3``) and measures p50 latencies through the raw HTTP API with a user key, each
pair in the same run and in alternating rounds (which of the two goes first alternates):

- a Codex-style turn (``store: false``, the whole conversation of 20 items sent back, with
  ``include: ["reasoning.encrypted_content"]`` and ``client_metadata``) against the same
  turn continued with ``previous_response_id`` from a stored response;
- ``include: ["reasoning.encrypted_content"]`` on a ``mock_qwen3`` response
  (``store: false``) against none, and in this process what sealing and opening a 4 KB
  reasoning costs (:class:`~gateway.serving.responses.sealing.ReasoningSeal`);
- ``background: true``: the time to its ``queued`` answer, and to ``completed`` seen by
  polling ``GET /v1/responses/{id}`` every 20 ms, against the same request in the
  foreground;
- a turn in a conversation (``conversation=``, the conversation created first with the same
  20 items) against the same turn with ``previous_response_id``;
- ``store: true`` with ``metadata`` on ``/v1/chat/completions`` against no ``store``;
- ``truncation: "auto"`` on a conversation too long for ``mock_qwen3``'s 4,096-token
  context (60 messages of 3,000 bytes: the gateway judges at most 32 bytes a token) against
  the same request holding only the messages it keeps.
"""

from __future__ import annotations

import asyncio
import time
import timeit
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from gateway.serving.responses.sealing import ReasoningSeal
from tests.bench import options, rows_on_stack, write_table
from tests.bench.chat import pct
from tests.support.stack import GatewayProcess

ENCRYPTED = ["reasoning.encrypted_content"]
LOOKUP = {
    "type": "function",
    "name": "read_file",
    "description": "Reads a file of the repository",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}
NEXT = {"role": "user", "content": "Now write the test for it."}


def history() -> list[dict[str, Any]]:
    """19 input items of a coding agent's conversation: user and assistant messages and
    two tool calls with their outputs (the stored response's answer is the 20th)."""
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "You are a coding agent. " * 20},
    ]
    for turn in range(4):
        items.append({"role": "user", "content": f"Step {turn}: fix the parser. " * 10})
        items.append({"role": "assistant", "content": f"Done with step {turn}. " * 12})
    items.append({"role": "user", "content": "Read the two modules it uses."})
    for turn in range(2):
        call_id = f"call_{turn}"
        arguments = f'{{"path": "src/module_{turn}.py"}}'
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "read_file",
                "arguments": arguments,
            }
        )
        items.append(
            {"type": "function_call_output", "call_id": call_id, "output": "def f(): pass\n" * 30}
        )
        items.append({"role": "assistant", "content": f"Read module {turn}. " * 10})
    items.append({"role": "user", "content": "Summarise what changed."})
    items.append({"role": "assistant", "content": "The parser now handles nested lists. " * 5})
    items.append({"role": "user", "content": "Good. Anything else?"})
    assert len(items) == 19
    return items


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


async def alternating(
    baseline: Callable[[], Awaitable[object]],
    feature: Callable[[], Awaitable[object]],
    count: int,
) -> tuple[float, float]:
    """p50 milliseconds of each of the two, after a few of each to warm, in rounds whose
    order alternates."""
    for _ in range(max(2, count // 8)):
        await baseline()
        await feature()
    base: list[float] = []
    with_feature: list[float] = []
    for round_ in range(count):
        if round_ % 2:
            with_feature.append(await timed(feature))
            base.append(await timed(baseline))
        else:
            base.append(await timed(baseline))
            with_feature.append(await timed(feature))
    return pct(base, 50), pct(with_feature, 50)


async def create(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    answer = dict(response.json())
    assert answer["status"] in ("completed", "queued"), answer
    return answer


def sent_back(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items as a client sends them back as input (their ``status`` left out)."""
    return [{k: v for k, v in item.items() if k != "status"} for item in items]


async def stateless_row(http: httpx.AsyncClient, base: dict[str, Any], count: int) -> str:
    conversation = [*history(), *sent_back(base["output"]), NEXT]
    codex = {
        "model": "mock_chat",
        "input": conversation,
        "tools": [LOOKUP],
        "store": False,
        "include": ENCRYPTED,
        "client_metadata": {"session_id": "bench-session", "turn_id": "bench-turn"},
    }
    chained = {
        "model": "mock_chat",
        "input": [NEXT],
        "tools": [LOOKUP],
        "previous_response_id": base["id"],
    }
    assert (await create(http, codex))["usage"]["input_tokens"] == (await create(http, chained))[
        "usage"
    ]["input_tokens"]  # the same prompt either way
    stored, stateless = await alternating(
        lambda: create(http, chained), lambda: create(http, codex), count
    )
    return (
        f"| /v1/responses turn on a 20-item conversation (mock_chat): previous_response_id "
        f"(stored) vs Codex-style store=false, all 20 items sent back | {stored:.2f} ms | "
        f"{stateless:.2f} ms | ratio **{stateless / stored:.2f}** |"
    )


def seal_cost_us() -> tuple[float, float]:
    """Sealing and opening a 4 KB reasoning in this process, in microseconds."""
    seal = ReasoningSeal([ReasoningSeal.new_key()])
    reasoning = ("The user wants a test; first I check the parser. " * 90)[:4096]
    sealer = seal.sealer("key_bench", "mock_qwen3")
    sealed = sealer(reasoning)
    assert seal.open(sealed, "key_bench", "input[0].encrypted_content") == reasoning
    runs = 1000
    seal_s = min(timeit.repeat(lambda: sealer(reasoning), number=runs, repeat=5))
    open_s = min(
        timeit.repeat(
            lambda: seal.open(sealed, "key_bench", "input[0].encrypted_content"),
            number=runs,
            repeat=5,
        )
    )
    return seal_s / runs * 1e6, open_s / runs * 1e6


async def sealed_rows(http: httpx.AsyncClient, count: int) -> list[str]:
    plain = {"model": "mock_qwen3", "input": "What is a parser?", "store": False}
    sealed = {**plain, "include": ENCRYPTED}
    answer = await create(http, sealed)
    reasoning = [item for item in answer["output"] if item["type"] == "reasoning"]
    assert reasoning and reasoning[0].get("encrypted_content"), answer
    without, with_include = await alternating(
        lambda: create(http, plain), lambda: create(http, sealed), count
    )
    seal_us, open_us = seal_cost_us()
    return [
        f"| mock_qwen3 /v1/responses store=false, include reasoning.encrypted_content: none vs "
        f"sealed | {without:.2f} ms | {with_include:.2f} ms | added "
        f"**{with_include - without:+.2f} ms** |",
        f"| ReasoningSeal on a 4 KB reasoning, in process (seal / open) | - | {seal_us:.0f} µs / "
        f"{open_us:.0f} µs | |",
    ]


async def background_rows(http: httpx.AsyncClient, count: int) -> list[str]:
    body = {"model": "mock_chat", "input": "hello there"}
    queued: list[float] = []

    async def foreground() -> None:
        await create(http, body)

    async def to_queued() -> None:
        start = time.perf_counter()
        answer = await create(http, {**body, "background": True})
        queued.append((time.perf_counter() - start) * 1000)
        assert answer["status"] == "queued", answer
        await until_done(answer["id"])

    async def to_completed() -> None:
        answer = await create(http, {**body, "background": True})
        await until_done(answer["id"])

    async def until_done(response_id: str) -> None:
        while True:
            await asyncio.sleep(0.02)
            got = await http.get(f"/v1/responses/{response_id}")
            assert got.status_code == 200, got.text
            status = got.json()["status"]
            if status == "completed":
                return
            assert status in ("queued", "in_progress"), got.text

    fore, done = await alternating(foreground, to_completed, count)
    queued.clear()
    fore_again, _ = await alternating(foreground, to_queued, count)
    q = pct(queued, 50)
    return [
        f"| mock_chat /v1/responses: foreground create vs background: true, POST to its "
        f"`queued` answer | {fore_again:.2f} ms | {q:.2f} ms | ratio **{q / fore_again:.2f}** |",
        f"| the same, POST to `completed` seen by GET every 20 ms | {fore:.2f} ms | {done:.2f} ms "
        f"| added **{done - fore:+.2f} ms** |",
    ]


async def conversation_row(http: httpx.AsyncClient, base: dict[str, Any], count: int) -> str:
    items = [*history(), *sent_back(base["output"])]
    for item in items:
        item.pop("id", None)
    conversations: list[str] = []
    for _ in range(count + max(2, count // 8)):
        made = await http.post("/v1/conversations", json={"items": items})
        assert made.status_code == 200, made.text
        conversations.append(made.json()["id"])
    chained = {
        "model": "mock_chat",
        "input": [NEXT],
        "tools": [LOOKUP],
        "previous_response_id": base["id"],
    }

    async def in_conversation() -> None:
        body = {"model": "mock_chat", "input": [NEXT], "tools": [LOOKUP]}
        answer = await create(http, {**body, "conversation": conversations.pop()})
        assert answer["conversation"]["id"], answer

    previous, conversation = await alternating(
        lambda: create(http, chained), in_conversation, count
    )
    return (
        f"| mock_chat turn after 20 items: previous_response_id vs conversation= (each a fresh "
        f"conversation of the same 20 items) | {previous:.2f} ms | {conversation:.2f} ms | "
        f"ratio **{conversation / previous:.2f}** |"
    )


async def stored_chat_row(http: httpx.AsyncClient, count: int) -> str:
    body = {
        "model": "mock_chat",
        "messages": [{"role": "user", "content": "hello there"}],
    }
    stored = {**body, "store": True, "metadata": {"run": "bench", "user": "u1"}}

    async def post(sent: dict[str, Any]) -> None:
        response = await http.post("/v1/chat/completions", json=sent)
        assert response.status_code == 200, response.text

    plain, kept = await alternating(lambda: post(body), lambda: post(stored), count)
    return (
        f"| mock_chat /v1/chat/completions: store absent vs store=true with metadata | "
        f"{plain:.2f} ms | {kept:.2f} ms | added **{kept - plain:+.2f} ms** |"
    )


async def truncation_row(http: httpx.AsyncClient, count: int) -> str:
    # 30 words of 100 bytes a message: the gateway's bound is bytes / 32 tokens, the
    # stand-in counts words, so the kept tail fits both.
    text = ("x" * 99 + " ") * 30
    messages = [
        {"role": "user" if index % 2 == 0 else "assistant", "content": text[:-1]}
        for index in range(59)
    ]
    messages.append({"role": "user", "content": text[:-10] + " go on"})
    whole = {
        "model": "mock_qwen3",
        "input": messages,
        "store": False,
        "max_output_tokens": 64,
        "truncation": "auto",
    }
    answer = await create(http, whole)
    dropped = answer["truncated_messages"]
    assert 0 < dropped < 60, answer
    tail = {**whole, "input": messages[dropped:]}
    del tail["truncation"]
    assert (await create(http, tail))["usage"] == answer["usage"]
    kept, auto = await alternating(lambda: create(http, tail), lambda: create(http, whole), count)
    return (
        f"| mock_qwen3 /v1/responses, 60 messages of 3,000 bytes: the {60 - dropped} kept sent "
        f"alone vs all with truncation auto ({dropped} dropped) | {kept:.2f} ms | {auto:.2f} ms "
        f"| auto adds **{auto - kept:+.2f} ms** |"
    )


async def gateway_rows(stack: GatewayProcess, scale: float) -> list[str]:
    rows: list[str] = []
    count = max(4, int(200 * scale))
    async with httpx.AsyncClient(
        base_url=stack.base_url, timeout=120, headers=stack.user_headers()
    ) as http:
        base = await create(http, {"model": "mock_chat", "input": history(), "tools": [LOOKUP]})
        rows.append(await stateless_row(http, base, count))
        print(rows[-1], flush=True)
        rows += await sealed_rows(http, count)
        print(*rows[-2:], sep="\n", flush=True)
        rows += await background_rows(http, max(4, count // 2))
        print(*rows[-2:], sep="\n", flush=True)
        rows.append(await conversation_row(http, base, count))
        print(rows[-1], flush=True)
        rows.append(await stored_chat_row(http, count))
        print(rows[-1], flush=True)
        rows.append(await truncation_row(http, max(4, count // 2)))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    args = options(__doc__)
    header = [
        "| measure | baseline | with the feature | ratio / cost |",
        "| --- | --- | --- | --- |",
    ]
    print(*header, sep="\n", flush=True)
    rows = rows_on_stack(["mock_chat", "mock_qwen3"], gateway_rows, args.scale)
    write_table(args.out, header + rows)


if __name__ == "__main__":
    main()
