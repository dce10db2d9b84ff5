"""What Anthropic's Messages API costs beside the chat route it is served by, on one
replica (no nginx) with mock_chat, measured in one run with the rounds alternating:

- the p50 latency of a whole 16-token answer, ``/v1/chat/completions`` against
  ``/v1/messages`` (the same conversation, one at a time);
- the replica's CPU per whole request and per streamed chunk (256-token streams, 4 at a
  time, less the cost of a one-token stream), read from ``/proc/<pid>/stat``.

Run with ``python -m tests.bench.messages`` (part of ``make bench``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from tests.bench import table_on_stack
from tests.bench.cpu import cpu_seconds
from tests.support.stack import GatewayProcess

PROMPT = "[mock:words=100000] Tell me about the quick brown fox."
CONCURRENCY = 4


def chat_body(tokens: int, stream: bool) -> dict[str, Any]:
    """The same request for both routes: chat and Messages share these fields."""
    messages = [{"role": "user", "content": PROMPT}]
    return {"model": "mock_chat", "max_tokens": tokens, "messages": messages, "stream": stream}


async def call(http: httpx.AsyncClient, route: str, tokens: int, stream: bool) -> None:
    path = "/v1/chat/completions" if route == "chat" else "/v1/messages"
    if not stream:
        response = await http.post(path, json=chat_body(tokens, False))
        assert response.status_code == 200, response.text
        return
    async with http.stream("POST", path, json=chat_body(tokens, True)) as response:
        assert response.status_code == 200
        async for _ in response.aiter_lines():
            pass


async def load(work: Callable[[], Awaitable[None]], total: int) -> None:
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await work()

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def cpu_per(pid: int, work: Callable[[], Awaitable[None]], total: int) -> float:
    before = cpu_seconds(pid)
    await load(work, total)
    return (cpu_seconds(pid) - before) / total


async def run(stack: GatewayProcess, scale: float) -> list[str]:
    pid = stack.process.pid if stack.process else 0
    rounds = max(2, round(4 * scale))
    latencies: dict[str, list[float]] = {"chat": [], "messages": []}
    whole: dict[str, list[float]] = {"chat": [], "messages": []}
    chunk: dict[str, list[float]] = {"chat": [], "messages": []}
    n = max(CONCURRENCY, round(100 * scale))
    async with httpx.AsyncClient(
        base_url=stack.base_url, timeout=120, headers=stack.user_headers()
    ) as http:
        for route in latencies:  # warm
            await load(lambda r=route: call(http, r, 16, False), CONCURRENCY * 2)  # type: ignore[misc]
        for _ in range(rounds):
            for route in latencies:
                for _ in range(n // 4):
                    start = time.perf_counter()
                    await call(http, route, 16, False)
                    latencies[route].append((time.perf_counter() - start) * 1000)
                whole[route].append(
                    await cpu_per(pid, lambda r=route: call(http, r, 16, False), n)  # type: ignore[misc]
                )
                long = await cpu_per(pid, lambda r=route: call(http, r, 256, True), n // 4)  # type: ignore[misc]
                one = await cpu_per(pid, lambda r=route: call(http, r, 1, True), n // 4)  # type: ignore[misc]
                chunk[route].append((long - one) / 255)
    p50 = {r: statistics.median(v) for r, v in latencies.items()}
    cpu = {r: statistics.mean(v) * 1000 for r, v in whole.items()}
    per_chunk = {r: statistics.mean(v) * 1e6 for r, v in chunk.items()}
    return [
        f"| p50 latency, whole 16-token answer | {p50['chat']:.2f} ms | {p50['messages']:.2f} ms "
        f"| **{p50['messages'] / p50['chat']:.2f}** |",
        f"| replica CPU per whole request | {cpu['chat']:.2f} ms | {cpu['messages']:.2f} ms "
        f"| **{cpu['messages'] / cpu['chat']:.2f}** |",
        f"| replica CPU per streamed chunk (256-token streams) | {per_chunk['chat']:.0f} µs "
        f"| {per_chunk['messages']:.0f} µs | **{per_chunk['messages'] / per_chunk['chat']:.2f}** |",
    ]


def main() -> None:
    header = [
        "| measure (mock_chat, one replica) | /v1/chat/completions | /v1/messages | ratio |",
        "| --- | --- | --- | --- |",
    ]
    table_on_stack(__doc__, header, ["mock_chat"], run)


if __name__ == "__main__":
    main()
