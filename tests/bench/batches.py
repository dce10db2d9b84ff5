"""Batch benchmark: how fast a batch drains against the same requests sent by a client at
the same concurrency, and an interactive client's latency with and without a batch running,
measured in one run.

Run with ``make bench`` (or ``python -m tests.bench.batches``). It starts ``gateway up``
(one gateway process, the weightless ``mock_chat`` model) with ``GATEWAY_BATCH_CONCURRENCY``
set to the client's concurrency (``--concurrency``, 8) and ``GATEWAY_TRITON_MAX_INFLIGHT``
to ``--slots`` (8: a batch alone would take every slot; 0: no slot limit). Every request is
the same chat request whose answer is 8 tokens 25 ms apart (about 200 ms). The input file of
``--lines`` requests is uploaded once, and the replica warmed with a few client requests;
then each round, in this order:

1. **Idle**: interactive clients alone for 4 s, one request at a time each (they read for
   50 ms between requests).
2. **Batch + interactive**: a batch of the file, and the same interactive clients for as
   long as it runs.
3. **Batch alone**: the same batch again, timed from ``batches.create`` until the SDK sees
   it ``completed`` (its output file written).
4. **Client alone**: the same requests sent over HTTP by ``--concurrency`` client tasks.

Rounds repeat (two by default) so that a drift in the shared machine's speed hits every
phase alike. It prints the requests per second of the batch and of the client and their
ratio, and the interactive p50/p99 idle and during a batch with their ratio (the goal: p50
within 2x of idle), and exits 1 if a batch line or a request failed. Client, gateway, Redis
and Triton share one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

import httpx
import openai

from tests.bench import keyed_client, write_table
from tests.bench.chat import pct
from tests.support.stack import GatewayProcess

CHAT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
BODY = {
    "model": "mock_chat",
    "messages": [{"role": "user", "content": "[mock:delay_ms=25] [mock:words=8] Sum up."}],
}


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    drains: list[float] = field(default_factory=list)
    """Seconds each batch (or client run) took for its requests."""


async def interactive(http: httpx.AsyncClient, tally: Tally, until: asyncio.Event) -> None:
    """One interactive user: a request, 50 ms of reading, the next, until ``until``."""
    while not until.is_set():
        start = time.perf_counter()
        response = await http.post(CHAT, json=BODY)
        if response.status_code != 200:
            tally.failed += 1
        else:
            tally.latencies.append(time.perf_counter() - start)
        await asyncio.sleep(0.05)


async def run_batch(sdk: openai.AsyncOpenAI, file_id: str, tally: Tally) -> None:
    """One batch of the uploaded file, from create to ``completed``."""
    start = time.perf_counter()
    batch = await sdk.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        await asyncio.sleep(0.05)
        batch = await sdk.batches.retrieve(batch.id)
    tally.drains.append(time.perf_counter() - start)
    counts = batch.request_counts
    if batch.status != "completed" or counts is None or counts.failed or not counts.completed:
        tally.failed += 1
        print(f"batch {batch.id} ended {batch.status}: {counts}", file=sys.stderr)


async def run_client(http: httpx.AsyncClient, lines: int, concurrency: int, tally: Tally) -> None:
    """The same requests, sent by ``concurrency`` tasks, each the next as soon as answered."""
    left = iter(range(lines))

    async def worker() -> None:
        for _ in left:
            response = await http.post(CHAT, json=BODY)
            tally.failed += response.status_code != 200

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    tally.drains.append(time.perf_counter() - start)


async def measure(
    stack: GatewayProcess, lines: int, concurrency: int, users: int, rounds: int
) -> tuple[list[str], bool]:
    spec = {"rpm": 10**9, "tpm": 10**12, "max_concurrency": 10**4}
    batch_key = stack.create_key("batch", **spec)["key"]
    user_key = stack.create_key("interactive", **spec)["key"]
    sdk = openai.AsyncOpenAI(base_url=stack.base_url + "/v1", api_key=batch_key, max_retries=0)
    data = "\n".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": BODY})
        for i in range(lines)
    ).encode()
    uploaded = await sdk.files.create(file=("bench.jsonl", data), purpose="batch")
    idle, during, batch, client, beside = Tally(), Tally(), Tally(), Tally(), Tally()

    async with (
        keyed_client(stack, user_key) as users_http,
        keyed_client(stack, batch_key) as client_http,
    ):
        warm = Tally()
        await run_client(client_http, 4 * concurrency, concurrency, warm)
        for _ in range(rounds):
            stop = asyncio.Event()
            running = [
                asyncio.create_task(interactive(users_http, idle, stop)) for _ in range(users)
            ]
            await asyncio.sleep(4.0)
            stop.set()
            await asyncio.gather(*running)

            stop = asyncio.Event()
            running = [
                asyncio.create_task(interactive(users_http, during, stop)) for _ in range(users)
            ]
            await run_batch(sdk, uploaded.id, beside)
            stop.set()
            await asyncio.gather(*running)

            await run_batch(sdk, uploaded.id, batch)
            await run_client(client_http, lines, concurrency, client)
    await sdk.close()
    failed = sum(t.failed for t in (idle, during, batch, client, beside, warm))

    def rate(tally: Tally) -> float:
        return lines * len(tally.drains) / sum(tally.drains)

    def ms(tally: Tally, q: float) -> str:
        return f"{1000 * pct(tally.latencies, q):.0f} ms"

    def ratio(during_: float, before: float) -> str:
        return f"**{during_ / before:.2f}x**"

    rows = [
        f"| {lines} requests, {concurrency} at once: client / batch | {rate(client):.1f} req/s "
        f"| {rate(batch):.1f} req/s | {ratio(rate(batch), rate(client))} |",
        f"| interactive p50 ({users} users): idle / during a batch (goal: at most 2x) "
        f"| {ms(idle, 50)} | {ms(during, 50)} "
        f"| {ratio(pct(during.latencies, 50), pct(idle.latencies, 50))} |",
        f"| interactive p99: idle / during a batch | {ms(idle, 99)} | {ms(during, 99)} "
        f"| {ratio(pct(during.latencies, 99), pct(idle.latencies, 99))} |",
        f"| interactive requests measured | {len(idle.latencies)} | {len(during.latencies)} | |",
    ]
    if failed:
        rows.append(f"| failures | {failed} | | |")
    return rows, failed == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=400, help="requests in the batch")
    parser.add_argument("--concurrency", type=int, default=8, help="GATEWAY_BATCH_CONCURRENCY")
    parser.add_argument("--users", type=int, default=2, help="interactive clients")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--slots",
        type=int,
        default=8,
        help="GATEWAY_TRITON_MAX_INFLIGHT (0: none); 8, as many as the batch's concurrency: "
        "a batch alone would take every slot",
    )
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    stack = GatewayProcess(
        models=["mock_chat"],
        nginx=False,
        env={
            "GATEWAY_BATCH_CONCURRENCY": str(args.concurrency),
            **({"GATEWAY_TRITON_MAX_INFLIGHT": str(args.slots)} if args.slots else {}),
        },
    ).start()
    header = [
        f"| mock_chat, 8-token answers (200 ms), one replica, GATEWAY_BATCH_CONCURRENCY="
        f"{args.concurrency}, GATEWAY_TRITON_MAX_INFLIGHT={args.slots or 'none'} "
        "| without a batch | with a batch | ratio |",
        "| --- | --- | --- | --- |",
    ]
    try:
        stack.wait_ready()
        rows, ok = asyncio.run(
            measure(stack, args.lines, args.concurrency, args.users, args.rounds)
        )
    finally:
        stack.stop()
    print(*header, *rows, sep="\n", flush=True)
    write_table(args.out, header + rows)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
