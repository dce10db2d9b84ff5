"""Priorities benchmark: a high-priority key's latency alone and under an overload of
low-priority requests, and how many of those are shed, measured in one run.

Run with ``make bench`` (or ``python -m tests.bench.priorities``). It starts ``gateway up``
(one gateway process, the weightless ``mock_chat`` model) with ``GATEWAY_TRITON_MAX_INFLIGHT``
set, so the gateway keeps at most that many requests in flight at Triton and queues the
rest by priority. Tokens come 25 ms apart: an interactive request is 10 tokens (about
250 ms), a bulk one 4 to 16 at random. Two keys: ``interactive`` (priority 0) and
``bulk`` (priority 10).

1. **Unloaded**: interactive clients alone, one request at a time each.
2. **Overload**: the same interactive clients while bulk clients keep far more requests
   coming than the slots and the queue hold; a bulk client shed with 503 ``overloaded``
   waits the ``Retry-After`` it was given (as the openai SDK does; plus up to half of it
   again, so that the shed clients do not all come back in the same millisecond) and
   sends again.

The two phases alternate, four rounds of each, so that a drift in the shared machine's
speed hits both alike. It prints the interactive p50/p99 in both phases and their ratio
(the goal: p99 under overload within 2x of p99 unloaded), and the bulk requests sent,
served and shed (the client's count and ``gateway_shed_total``). Client, gateway, Redis
and Triton share one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import time
from dataclasses import dataclass, field

import httpx

from tests.bench import keyed_client, write_table
from tests.bench.chat import pct
from tests.support.stack import GatewayProcess

SLOTS = 8
ROUNDS = 4


def body(words: int) -> dict[str, object]:
    """A chat request whose answer is ``words`` tokens, 25 ms apart."""
    content = f"[mock:delay_ms=25] [mock:words={words}] Sum up."
    return {"model": "mock_chat", "messages": [{"role": "user", "content": content}]}


INTERACTIVE = body(10)


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    sent: int = 0
    shed: int = 0
    other: dict[int, int] = field(default_factory=dict)


async def interactive(http: httpx.AsyncClient, tally: Tally, count: int) -> None:
    """One client of the interactive key: ``count`` requests, one after the other."""
    for _ in range(count):
        start = time.perf_counter()
        response = await http.post("/v1/chat/completions", json=INTERACTIVE)
        tally.sent += 1
        if response.status_code != 200:
            tally.other[response.status_code] = tally.other.get(response.status_code, 0) + 1
            continue
        tally.latencies.append(time.perf_counter() - start)
        await asyncio.sleep(0.05)  # the user reads


async def bulk(http: httpx.AsyncClient, tally: Tally, stop: asyncio.Event) -> None:
    """One client of the bulk key: sends again as soon as it is answered, and after a 503
    waits its ``Retry-After``."""
    while not stop.is_set():
        # Jobs of 4 to 16 tokens (100 to 400 ms): real requests differ in length.
        response = await http.post("/v1/chat/completions", json=body(random.randint(4, 16)))
        tally.sent += 1
        if response.status_code == 200:
            tally.latencies.append(0.0)
        elif response.status_code == 503 and response.json()["error"]["code"] == "overloaded":
            tally.shed += 1
            wait = float(response.headers["retry-after"]) * random.uniform(1.0, 1.5)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
        else:
            tally.other[response.status_code] = tally.other.get(response.status_code, 0) + 1


def waited(metrics: str) -> tuple[float, float]:
    """The interactive key's (priority 0) time waiting for a slot: sum and count."""
    found = dict(
        re.findall(r'gateway_queue_wait_seconds_(sum|count)\{priority="0"\} ([\d.e+-]+)', metrics)
    )
    return float(found.get("sum", 0)), float(found.get("count", 0))


def spread_ms(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"p50 {pct(ms, 50):.0f} / p99 {pct(ms, 99):.0f} ms"


async def measure(stack: GatewayProcess, scale: float, users: int, bulk_users: int) -> list[str]:
    high = stack.create_key("interactive", priority=0)["key"]
    low = stack.create_key("bulk", priority=10)["key"]
    per_user = max(ROUNDS * 5, int(200 * scale))

    async with keyed_client(stack, high) as hi, keyed_client(stack, low) as lo:
        await asyncio.gather(*(interactive(hi, Tally(), 5) for _ in range(users)))  # warm up
        alone, loaded, flood = Tally(), Tally(), Tally()
        wait_sum = wait_count = 0.0
        # Alternating rounds, so that a drift in the machine's speed (it is shared) hits
        # both phases alike.
        for _ in range(ROUNDS):
            await asyncio.gather(
                *(interactive(hi, alone, per_user // ROUNDS) for _ in range(users))
            )
            stop = asyncio.Event()
            flooding = [asyncio.create_task(bulk(lo, flood, stop)) for _ in range(bulk_users)]
            await asyncio.sleep(1.5)  # the queue fills
            before = waited((await hi.get("/metrics")).text)
            await asyncio.gather(
                *(interactive(hi, loaded, per_user // ROUNDS) for _ in range(users))
            )
            after = waited((await hi.get("/metrics")).text)
            wait_sum, wait_count = (
                wait_sum + after[0] - before[0],
                wait_count + after[1] - before[1],
            )
            stop.set()
            await asyncio.gather(*flooding)  # the queue drains before the next round
        metrics = (await hi.get("/metrics")).text
    mean_wait = 1000 * wait_sum / max(1.0, wait_count)
    counted = sum(
        float(v)
        for v in re.findall(r'gateway_shed_total\{model="mock_chat",[^}]*\} ([\d.]+)', metrics)
    )
    ratio = pct(loaded.latencies, 99) / pct(alone.latencies, 99)
    served = len(flood.latencies)
    return [
        f"| unloaded: {users} interactive clients alone | {len(alone.latencies)} | "
        f"{spread_ms(alone.latencies)} | - |",
        f"| overload: the same, with {bulk_users} bulk clients | {len(loaded.latencies)} | "
        f"{spread_ms(loaded.latencies)} | sent {flood.sent}, served {served}, "
        f"**shed {flood.shed}** with 503 overloaded (gateway_shed_total {counted:.0f}) |",
        f"| interactive p99, overload / unloaded | | **{ratio:.2f}x** (goal: at most 2x); "
        f"mean wait for a slot {mean_wait:.0f} ms | "
        f"interactive errors: {loaded.other or alone.other or 'none'} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--users", type=int, default=2, help="interactive clients")
    parser.add_argument("--bulk", type=int, default=32, help="bulk clients")
    parser.add_argument("--slots", type=int, default=SLOTS, help="GATEWAY_TRITON_MAX_INFLIGHT")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    stack = GatewayProcess(
        models=["mock_chat"],
        nginx=False,
        env={
            "GATEWAY_TRITON_MAX_INFLIGHT": str(args.slots),
            "GATEWAY_QUEUE_MAX_WAITING": str(2 * args.slots),
            "GATEWAY_QUEUE_MAX_WAIT_S": "10",
        },
    ).start()
    header = [
        f"| phase (GATEWAY_TRITON_MAX_INFLIGHT={args.slots}) | interactive "
        "requests | interactive latency | bulk (priority 10) |",
        "| --- | --- | --- | --- |",
    ]
    try:
        stack.wait_ready()
        rows = asyncio.run(measure(stack, args.scale, args.users, args.bulk))
    finally:
        stack.stop()
    print(*header, *rows, sep="\n", flush=True)
    write_table(args.out, header + rows)


if __name__ == "__main__":
    main()
