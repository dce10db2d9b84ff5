"""Embeddings benchmark: Triton's dynamic batching on and off for ``e5_small``, in one run.

Run with ``python -m tests.bench.embeddings``. It starts the real stack on free ports, then
sends single-text requests (one short query each, as a search box does) straight to Triton
with ``tritonclient.grpc.aio``:

- requests/s and latency at concurrency 16, with the config as shipped (dynamic batching
  on) and without its ``dynamic_batching`` block (each request executed alone);
- latency at concurrency 1, the price of ``max_queue_delay_microseconds`` when idle.

The two settings alternate in rounds of the same run (off, on, on, off, ...), switched by
reloading the model through Triton's repository API with a JSON config that replaces
``config.pbtxt``; a drift in machine speed then hits both alike. Everything shares one small
machine, so compare the ratios, not absolute numbers.

Then the same single-query requests go through the gateway's ``/v1/embeddings`` (one
replica, a user key), batching off and on, at concurrency 16.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc.aio as triton_grpc

from tests.bench import write_table
from tests.bench.chat import pct
from tests.support.stack import GatewayProcess

MODEL = "e5_small"
QUERY = "How much protein should an adult eat per day?"
HEADER = [
    "| measure | path | concurrency | batching off | batching on | on / off |",
    "| --- | --- | --- | --- | --- | --- |",
]

Call = Callable[[], Awaitable[None]]


@dataclass
class Side:
    """What one setting (batching on or off) measured over all its rounds."""

    latencies: list[float] = field(default_factory=list)  # milliseconds
    wall: float = 0.0  # seconds spent in the measured rounds
    executions: dict[int, int] = field(default_factory=dict)  # batch size -> executions

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall

    def mean_batch(self) -> float:
        runs = sum(self.executions.values())
        return sum(size * n for size, n in self.executions.items()) / runs if runs else 0.0


def spread(values: list[float]) -> str:
    return f"p50 {pct(values, 50):.1f} / p99 {pct(values, 99):.1f} ms"


def query_inputs(text: str = QUERY) -> list[triton_grpc.InferInput]:
    """One text as a query: the tensors the gateway would send for a one-string input."""
    texts = triton_grpc.InferInput("text_input", [1, 1], "BYTES")
    texts.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    kinds = triton_grpc.InferInput("input_type", [1, 1], "BYTES")
    kinds.set_data_from_numpy(np.array([[b"query"]], dtype=np.object_))
    return [texts, kinds]


def direct_call(client: triton_grpc.InferenceServerClient) -> Call:
    async def call() -> None:
        result = await client.infer(MODEL, query_inputs())
        assert result.as_numpy("embedding").shape == (1, 384)

    return call


async def run_load(call: Call, concurrency: int, total: int) -> tuple[list[float], float]:
    """``total`` calls, ``concurrency`` at a time; latencies in ms and the wall time."""
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - start) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - start


async def executions(client: triton_grpc.InferenceServerClient) -> dict[int, int]:
    """Executions per batch size so far (Triton's statistics of the loaded model)."""
    stats = await client.get_inference_statistics(MODEL, as_json=True)
    out: dict[int, int] = {}
    for model in stats.get("model_stats", []):
        for batch in model.get("batch_stats", []):
            size = int(batch["batch_size"])
            out[size] = out.get(size, 0) + int(batch["compute_infer"]["count"])
    return out


class Batching:
    """Switches ``e5_small`` between its shipped config and the same without dynamic
    batching, by reloading it with a config override (Triton's repository API)."""

    def __init__(self, client: triton_grpc.InferenceServerClient, shipped: dict[str, Any]):
        assert "dynamic_batching" in shipped, "the shipped config batches dynamically"
        self.client = client
        self.shipped = shipped
        self.on = True

    @classmethod
    async def of(cls, client: triton_grpc.InferenceServerClient) -> Batching:
        return cls(client, (await client.get_model_config(MODEL, as_json=True))["config"])

    async def set(self, on: bool) -> None:
        if on == self.on:
            return
        config = {k: v for k, v in self.shipped.items() if on or k != "dynamic_batching"}
        await self.client.load_model(MODEL, config=json.dumps(config))
        loaded = (await self.client.get_model_config(MODEL, as_json=True))["config"]
        assert ("dynamic_batching" in loaded) == on, loaded
        self.on = on


async def batching_rounds(
    batching: Batching, call: Call, concurrency: int, total: int, rounds: int = 6
) -> dict[bool, Side]:
    """``total`` calls per setting, in ``rounds`` alternating rounds (off, on, on, off, ...:
    one reload per round). Returns each setting's measurements, keyed by ``on``."""
    sides = {False: Side(), True: Side()}
    per_round = max(concurrency, total // rounds)
    for index in range(rounds):
        for on in (False, True) if index % 2 == 0 else (True, False):
            changed = on != batching.on
            await batching.set(on)
            if changed:  # a fresh model instance: warm it (engine threads, connections)
                await run_load(call, concurrency, concurrency * 2)
            before = await executions(batching.client)
            latencies, wall = await run_load(call, concurrency, per_round)
            after = await executions(batching.client)
            side = sides[on]
            side.latencies += latencies
            side.wall += wall
            for size, n in after.items():
                side.executions[size] = side.executions.get(size, 0) + n - before.get(size, 0)
    await batching.set(True)  # leave the model as shipped
    return sides


async def direct_rows(stack: GatewayProcess, scale: float) -> list[str]:
    """Rows for single-query requests sent straight to Triton."""
    client = triton_grpc.InferenceServerClient(stack.triton_grpc)
    batching = await Batching.of(client)
    path = "direct Triton gRPC"
    rows = []
    try:
        for concurrency, total in ((16, 1920), (1, 240)):
            call = direct_call(client)
            await run_load(call, concurrency, concurrency * 4)  # warm up
            sides = await batching_rounds(batching, call, concurrency, int(total * scale))
            off, on = sides[False], sides[True]
            new = []
            if concurrency > 1:
                new.append(
                    f"| requests/s, one short query per request | {path} | {concurrency} | "
                    f"{off.rate:,.1f} /s | {on.rate:,.1f} /s | **{on.rate / off.rate:.2f}x** |"
                )
            new.append(
                f"| latency | {path} | {concurrency} | {spread(off.latencies)} | "
                f"{spread(on.latencies)} | p50 "
                f"{pct(on.latencies, 50) / pct(off.latencies, 50):.2f}x |"
            )
            new.append(
                f"| texts per model execution (mean) | {path} | {concurrency} | "
                f"{off.mean_batch():.1f} | {on.mean_batch():.1f} | |"
            )
            print(*new, sep="\n", flush=True)
            rows += new
    finally:
        await client.close()
    return rows


def gateway_call(http: httpx.AsyncClient) -> Call:
    async def call() -> None:
        body = {"model": MODEL, "input": QUERY, "encoding_format": "base64"}
        response = await http.post("/v1/embeddings", json=body)
        assert response.status_code == 200, response.text

    return call


async def gateway_rows(stack: GatewayProcess, scale: float) -> list[str]:
    """The same requests through the gateway's /v1/embeddings (one replica, a user key with
    limits it never reaches), batching off and on."""
    client = triton_grpc.InferenceServerClient(stack.triton_grpc)
    batching = await Batching.of(client)
    path = "gateway /v1/embeddings"
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    try:
        async with httpx.AsyncClient(
            base_url=stack.base_url, timeout=60, limits=limits, headers=stack.user_headers()
        ) as http:
            call = gateway_call(http)
            await run_load(call, 16, 64)
            sides = await batching_rounds(batching, call, 16, int(960 * scale))
    finally:
        await client.close()
    off, on = sides[False], sides[True]
    rows = [
        f"| requests/s, one short query per request | {path} | 16 | {off.rate:,.1f} /s | "
        f"{on.rate:,.1f} /s | **{on.rate / off.rate:.2f}x** |",
        f"| latency | {path} | 16 | {spread(off.latencies)} | {spread(on.latencies)} | "
        f"p50 {pct(on.latencies, 50) / pct(off.latencies, 50):.2f}x |",
    ]
    print(*rows, sep="\n", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    stack = GatewayProcess(models=[MODEL], nginx=False).start()
    try:
        stack.wait_ready()
        print(*HEADER, sep="\n", flush=True)
        rows = asyncio.run(direct_rows(stack, args.scale))
        rows += asyncio.run(gateway_rows(stack, args.scale))
    finally:
        stack.stop()
    write_table(args.out, HEADER + rows)


if __name__ == "__main__":
    main()
