"""The gateway's own CPU per request, read from the kernel, and its memory over many requests.

Run with ``python -m tests.bench.cpu`` (part of ``make bench``). It starts the stack as
``make run`` does (nginx in front of two replicas), then sends requests straight to one
replica with a user key whose limits are never reached (so every request takes the whole
Redis path: key lookup, admission, usage) and reads that replica's ``utime + stime`` from
``/proc/<pid>/stat`` before and after:

- CPU per non-streaming chat request (mock_chat, 16 tokens, a weightless model);
- CPU per streamed chunk (mock_chat, 256-token streams, less the cost of a one-token
  stream, so the per-request part is not counted twice);
- CPU per ``GET /health/live`` (no key, no Redis: the floor of any request);
- the replica's resident memory before and after 10,000 chat requests.

The client runs in this process on the same 2 cores, so what matters is CPU time, not wall
time: the numbers hold however busy the machine is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from tests.stack import GatewayProcess

TICK = os.sysconf("SC_CLK_TCK")
MESSAGES = [{"role": "user", "content": "Tell me about the quick brown fox."}]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def load(call: Callable[[], Awaitable[int]], concurrency: int, total: int) -> int:
    """Runs ``total`` calls, ``concurrency`` at a time; returns the sum of what they return."""
    remaining, counted = total, 0

    async def worker() -> None:
        nonlocal remaining, counted
        while remaining > 0:
            remaining -= 1
            got = await call()  # awaited first: `counted += await ...` would lose updates
            counted += got

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counted


async def measure(
    pid: int, call: Callable[[], Awaitable[int]], concurrency: int, total: int
) -> tuple[float, int]:
    """CPU seconds the replica spent on ``total`` calls, and what the calls counted."""
    before = cpu_seconds(pid)
    counted = await load(call, concurrency, total)
    return cpu_seconds(pid) - before, counted


async def run(stack: GatewayProcess, scale: float) -> list[str]:
    address = stack.replica_addresses()[0]
    pid = stack.replica_pid(address)
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(
        base_url=f"http://{address}", timeout=60, limits=limits, headers=stack.user_headers()
    ) as http:

        async def chat() -> int:
            body = {"model": "mock_chat", "messages": MESSAGES, "max_tokens": 16}
            response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            return 1

        def stream(tokens: int) -> Callable[[], Awaitable[int]]:
            async def call() -> int:
                body = {"model": "mock_chat", "messages": MESSAGES, "max_tokens": tokens}
                chunks = 0
                async with http.stream(
                    "POST", "/v1/chat/completions", json={**body, "stream": True}
                ) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        chunks += line.startswith("data: {") and '"content":"' in line
                return chunks

            return call

        async def health() -> int:
            response = await http.get("/health/live")
            assert response.status_code == 200
            return 1

        await load(chat, 8, 200)  # warm up: connections, caches, imports
        await load(stream(256), 4, 8)
        rows = []
        n = int(2000 * scale)
        seconds, count = await measure(pid, chat, 8, n)
        rows.append(
            f"| CPU per non-streaming chat request (user key) | {seconds / count * 1000:.2f} ms |"
        )
        print(rows[-1], flush=True)
        streams = int(60 * scale)
        long_s, long_chunks = await measure(pid, stream(256), 4, streams)
        short_s, short_chunks = await measure(pid, stream(1), 4, streams)
        per_chunk = (long_s - short_s) / (long_chunks - short_chunks)
        rows.append(f"| CPU per streamed chunk | {per_chunk * 1e6:.0f} µs |")
        print(rows[-1], flush=True)
        seconds, count = await measure(pid, health, 8, int(3000 * scale))
        rows.append(f"| CPU per GET /health/live | {seconds / count * 1000:.2f} ms |")
        print(rows[-1], flush=True)
        start_rss = rss_mb(pid)
        await load(chat, 8, int(10_000 * scale))
        rows.append(
            f"| replica RSS before / after {int(10_000 * scale):,} chat requests | "
            f"{start_rss:.0f} MB / {rss_mb(pid):.0f} MB |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    header = ["| measure (one replica of `make run`) | value |", "| --- | --- |"]
    print(*header, sep="\n", flush=True)
    stack = GatewayProcess(models=["mock_chat"]).start()
    try:
        stack.wait_ready()
        rows = asyncio.run(run(stack, args.scale))
    finally:
        stack.stop()
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(header + rows) + "\n")


if __name__ == "__main__":
    main()
