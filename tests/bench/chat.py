"""Chat benchmark: the gateway against a direct Triton call, measured in the same run.

Run with ``make bench`` (or ``python -m tests.bench.chat``). It starts the real stack on
free ports, then measures on the weightless ``mock_chat`` model, so the numbers are the
gateway's own cost:

- non-streaming latency (p50/p99) and the latency the gateway adds, at concurrency 1 and 32,
  and requests per second at 32 as a ratio to direct;
- time to first token and streamed chunks per second (as a ratio to direct) at concurrency
  1 and 64;
- SmolLM2 decode tokens/s through the gateway against llama-cpp-python called directly.

Direct calls use ``tritonclient.grpc.aio`` with the same tensors the gateway sends; gateway
calls use ``httpx`` (the transport under the openai SDK) with a minimal SSE reader.
Gateway calls use a user key with limits it never reaches, so each request takes the whole
Redis path (key lookup, rate-limit admission, usage). Everything shares one 2-core machine,
so compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import numpy as np
import tritonclient.grpc.aio as triton_grpc

from tests.bench import write_table
from tests.support.smollm2 import weights_path
from tests.support.stack import GatewayProcess

# mock_chat answers as many words as the directive says (max_tokens caps them).
MESSAGES = [{"role": "user", "content": "[mock:words=100000] Tell me about the quick brown fox."}]
PROMPT = (
    "<|im_start|>user\n[mock:words=100000] Tell me about the quick brown fox.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@dataclass
class Sample:
    latency: float  # seconds, whole request
    ttft: float  # seconds to the first text
    chunks: int


def _inputs(stream: bool, max_tokens: int) -> list[triton_grpc.InferInput]:
    def tensor(name: str, value: np.ndarray, datatype: str) -> triton_grpc.InferInput:
        item = triton_grpc.InferInput(name, [1], datatype)
        item.set_data_from_numpy(value)
        return item

    params = json.dumps({"max_tokens": max_tokens}).encode()
    true = np.array([True])
    return [
        tensor("text_input", np.array([PROMPT.encode()], dtype=np.object_), "BYTES"),
        tensor("stream", np.array([stream]), "BOOL"),
        tensor("sampling_parameters", np.array([params], dtype=np.object_), "BYTES"),
        tensor("exclude_input_in_output", true, "BOOL"),
        tensor("return_finish_reason", true, "BOOL"),
        tensor("return_num_input_tokens", true, "BOOL"),
        tensor("return_num_output_tokens", true, "BOOL"),
    ]


async def direct_call(
    client: triton_grpc.InferenceServerClient, stream: bool, max_tokens: int
) -> Sample:
    async def requests():  # type: ignore[no-untyped-def]
        yield {
            "model_name": "mock_chat",
            "inputs": _inputs(stream, max_tokens),
            "enable_empty_final_response": True,
        }

    start = time.perf_counter()
    ttft, chunks = 0.0, 0
    async for result, error in client.stream_infer(requests()):
        assert error is None, error
        if result.as_numpy("text_output")[0]:
            chunks += 1
            ttft = ttft or time.perf_counter() - start
    return Sample(time.perf_counter() - start, ttft, chunks)


async def gateway_call(http: httpx.AsyncClient, stream: bool, max_tokens: int) -> Sample:
    body = {"model": "mock_chat", "messages": MESSAGES, "max_tokens": max_tokens, "stream": stream}
    start = time.perf_counter()
    if not stream:
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        elapsed = time.perf_counter() - start
        return Sample(elapsed, elapsed, 1)
    ttft, chunks = 0.0, 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                chunks += 1
                ttft = ttft or time.perf_counter() - start
    return Sample(time.perf_counter() - start, ttft, chunks)


async def health_call(http: httpx.AsyncClient) -> Sample:
    start = time.perf_counter()
    response = await http.get("/health/live")
    assert response.status_code == 200
    elapsed = time.perf_counter() - start
    return Sample(elapsed, elapsed, 0)


async def run_load(
    call: Callable[[], Awaitable[Sample]], concurrency: int, total: int
) -> tuple[list[Sample], float]:
    """``total`` calls, ``concurrency`` at a time; returns the samples and the wall time."""
    samples: list[Sample] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            samples.append(await call())

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def spread(values: list[float]) -> str:
    """``p50 X / p99 Y ms`` of latencies in milliseconds."""
    return f"p50 {pct(values, 50):.2f} / p99 {pct(values, 99):.2f} ms"


async def paired(
    direct: Callable[[], Awaitable[Sample]],
    gateway: Callable[[], Awaitable[Sample]],
    concurrency: int,
    total: int,
    rounds: int = 6,
) -> tuple[list[Sample], float, list[Sample], float]:
    """Runs both sides in alternating rounds, so a drift in machine speed (shared 2-core
    host) hits both alike. Returns samples and summed wall time of each side."""
    d_samples: list[Sample] = []
    g_samples: list[Sample] = []
    d_wall = g_wall = 0.0
    per_round = max(concurrency, total // rounds)
    for _ in range(rounds):
        samples, wall = await run_load(direct, concurrency, per_round)
        d_samples += samples
        d_wall += wall
        samples, wall = await run_load(gateway, concurrency, per_round)
        g_samples += samples
        g_wall += wall
    return d_samples, d_wall, g_samples, g_wall


async def mock_benchmarks(stack: GatewayProcess, scale: float) -> list[str]:
    rows = []
    client = triton_grpc.InferenceServerClient(stack.triton_grpc)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    headers = stack.user_headers()
    async with httpx.AsyncClient(
        base_url=stack.base_url, timeout=60, limits=limits, headers=headers
    ) as http:
        for concurrency in (1, 32):
            n = int((600 if concurrency == 1 else 1920) * scale)
            # Warm both paths (connections, caches) before measuring.
            warm = max(50, concurrency * 4)
            await run_load(lambda: direct_call(client, False, 16), concurrency, warm)
            await run_load(lambda: gateway_call(http, False, 16), concurrency, warm)
            direct, d_wall, gateway, g_wall = await paired(
                lambda: direct_call(client, False, 16),
                lambda: gateway_call(http, False, 16),
                concurrency,
                n,
            )
            d = [s.latency * 1000 for s in direct]
            g = [s.latency * 1000 for s in gateway]
            if concurrency == 1:
                # The floor of any HTTP call here: httpx -> uvicorn -> a route doing nothing.
                floor, _ = await run_load(lambda: health_call(http), 1, n // 2)
                f = [s.latency * 1000 for s in floor]
                rows.append(
                    f"| HTTP floor: GET /health/live | 1 | - | p50 {pct(f, 50):.2f} ms | "
                    "(an HTTP round trip from a Python client) |"
                )
            rows.append(
                f"| non-streaming latency, 16 tokens | {concurrency} | "
                f"{spread(d)} | {spread(g)} | "
                f"added p50 **{pct(g, 50) - pct(d, 50):+.2f} ms**, "
                f"p99 {pct(g, 99) - pct(d, 99):+.2f} ms |"
            )
            if concurrency > 1:
                d_rps, g_rps = len(direct) / d_wall, len(gateway) / g_wall
                rows.append(
                    f"| requests/s, 16 tokens | {concurrency} | {d_rps:,.0f} /s | "
                    f"{g_rps:,.0f} /s | ratio **{g_rps / d_rps:.2f}** |"
                )
            # Streams at twice the concurrency: many long streams at once is where the
            # per-chunk cost shows.
            streams = concurrency if concurrency == 1 else 2 * concurrency
            n_stream = int((120 if concurrency == 1 else 384) * scale)
            direct, d_wall, gateway, g_wall = await paired(
                lambda: direct_call(client, True, 256),
                lambda: gateway_call(http, True, 256),
                streams,
                n_stream,
            )
            d_ttft = [s.ttft * 1000 for s in direct]
            g_ttft = [s.ttft * 1000 for s in gateway]
            rows.append(
                f"| time to first token (stream) | {streams} | "
                f"p50 {pct(d_ttft, 50):.2f} ms | p50 {pct(g_ttft, 50):.2f} ms | "
                f"added p50 {pct(g_ttft, 50) - pct(d_ttft, 50):+.2f} ms |"
            )
            d_rate = sum(s.chunks for s in direct) / d_wall
            g_rate = sum(s.chunks for s in gateway) / g_wall
            rows.append(
                f"| streamed chunks/s, 256 tokens | {streams} | {d_rate:,.0f} /s | "
                f"{g_rate:,.0f} /s | ratio **{g_rate / d_rate:.2f}** |"
            )
            print(*rows[-4:], sep="\n", flush=True)
    await client.close()
    return rows


DRAGON = "Write a long story about a dragon."


async def smollm2_through_gateway(http: httpx.AsyncClient) -> float:
    """Decode tokens/s after the first token (prompt processing excluded on both sides)."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": DRAGON}],
        "max_tokens": 128,
        "temperature": 0,
        "stream": True,
    }
    first, count = 0.0, 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if '"content":"' in line and '"content":""' not in line:
                count += 1
                first = first or time.perf_counter()
    return (count - 1) / (time.perf_counter() - first)


def smollm2_direct() -> Callable[[], float]:
    """llama-cpp-python in this process, with the prompt the gateway renders."""
    import os

    from llama_cpp import Llama

    path = weights_path()
    llm = Llama(model_path=path, n_ctx=8192, n_threads=os.cpu_count(), verbose=False)
    prompt = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        f"Hugging Face<|im_end|>\n<|im_start|>user\n{DRAGON}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)

    def run() -> float:
        first, count = 0.0, 0
        for chunk in llm.create_completion(
            tokens,
            max_tokens=128,
            temperature=0,
            top_k=0,
            min_p=0.0,
            repeat_penalty=1.0,
            stream=True,
        ):
            if chunk["choices"][0]["text"]:
                count += 1
                first = first or time.perf_counter()
        return (count - 1) / (time.perf_counter() - first)

    return run


async def smollm2_benchmark(stack: GatewayProcess, runs: int = 4) -> str:
    direct_run = smollm2_direct()
    direct, through = [], []
    async with httpx.AsyncClient(
        base_url=stack.base_url, timeout=120, headers=stack.headers
    ) as http:
        for _ in range(runs):  # alternate, as above
            through.append(await smollm2_through_gateway(http))
            direct.append(direct_run())
    d, g = statistics.median(direct), statistics.median(through)
    return (
        f"| SmolLM2 decode tokens/s (llama-cpp direct vs gateway) | 1 | "
        f"{d:.1f} tok/s | {g:.1f} tok/s | ratio **{g / d:.2f}** |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    # Straight to one gateway process: the gateway's own cost, without nginx (see edge.py).
    stack = GatewayProcess(models=["mock_chat", "smollm2"], nginx=False).start()
    try:
        stack.wait_ready()
        header = [
            "| measure | concurrency | direct Triton | through the gateway | gateway cost |",
            "| --- | --- | --- | --- | --- |",
        ]
        print(*header, sep="\n", flush=True)
        rows = asyncio.run(mock_benchmarks(stack, args.scale))
        rows.append(asyncio.run(smollm2_benchmark(stack)))
        print(rows[-1])
    finally:
        stack.stop()
    write_table(args.out, header + rows)


if __name__ == "__main__":
    main()
