"""TensorRT-LLM's LLM API model benchmark: the ``llmapi`` profile against the vLLM tensors.

Run with ``make bench`` (or ``python -m tests.bench.llmapi``). It starts the real stack on
free ports (one gateway process, no nginx, a user key whose limits are never reached) with
``mock_chat`` (the vLLM-backend tensors) and ``trtllm_llmapi`` (the LLM API stand-in,
decoupled). Both generate ``mock_chat``'s words (the same text; the stand-in is slower, as
the references straight to Triton show), so what differs for the gateway is the contract:
the LLM API sends the whole text so far in every response, with its engine's metrics, and
no token counts. All requests are ``/v1/completions`` (the stand-in has no chat template),
measured in alternating rounds of one run:

- non-streaming p50 latency, 16 tokens, through the gateway and, for reference, straight to
  Triton with ``tritonclient.grpc.aio`` and the tensors the gateway sends: the gateway's
  added latency per profile. For the LLM API it includes counting the usage with the
  estimate (flagged ``estimated``; ``mock_chat`` reports its counts);
- streamed chunks/s at 512 tokens (4 streams at a time), through the gateway and direct;
- the gateway's CPU per streamed chunk at 64 and at 512 tokens, read from ``/proc`` as
  ``tests/bench/cpu.py`` does (less the CPU of as many 1-token streams): whether a
  response's cost grows with the text before it;
- the gateway's own work on each response in this process (each model's contract, built
  from the config Triton serves, replaying a stream of 4,000 tokens recorded from the
  model): reading it and the engine's metrics, at the 64th, 512th and 3,999th response;
- how many observations of the engine metrics one streamed request adds to ``/metrics``.

Everything shares one 2-core machine: compare the two columns, not absolute numbers.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as triton_grpc
from tritonclient.grpc import service_pb2

from gateway.backend import grpc_streams as streams
from gateway.backend.base import SamplingOptions
from gateway.backend.profiles import Contract, contract_for
from gateway.backend.profiles.model_config import ModelConfig
from gateway.metrics import Metrics
from tests.bench import options, rows_on_stack, write_table
from tests.bench.chat import pct
from tests.bench.cpu import cpu_seconds
from tests.support.stack import GatewayProcess

MODELS = ("mock_chat", "trtllm_llmapi")
# mock_chat's word model answers as many words as the directive says (max_tokens caps them).
PROMPT = "[mock:words=100000] Tell me about the quick brown fox."
CONCURRENCY = 4
"""Streams at a time in the streaming measures."""
REPLAY_TOKENS = 4000
"""The recorded stream replayed in process (the stand-in's context: 4096 tokens)."""
REPLAYS = 5


@dataclass
class Run:
    """What a batch of calls took: wall seconds, the gateway's CPU seconds, chunks."""

    wall: float = 0.0
    cpu: float = 0.0
    chunks: int = 0

    def add(self, other: Run) -> None:
        self.wall += other.wall
        self.cpu += other.cpu
        self.chunks += other.chunks


# -- straight to Triton: the tensors each profile sends ------------------------------------


def _tensor(name: str, value: npt.NDArray[Any], datatype: str) -> triton_grpc.InferInput:
    item = triton_grpc.InferInput(name, list(value.shape), datatype)
    item.set_data_from_numpy(value)
    return item


def direct_inputs(model: str, stream: bool, max_tokens: int) -> list[triton_grpc.InferInput]:
    """The request the gateway sends for ``/v1/completions`` on each model."""
    text = _tensor("text_input", np.array([PROMPT.encode()], dtype=np.object_), "BYTES")
    true = np.array([True])
    if model == "mock_chat":
        params = json.dumps({"max_tokens": max_tokens}).encode()
        return [
            text,
            _tensor("stream", np.array([stream]), "BOOL"),
            _tensor("sampling_parameters", np.array([params], dtype=np.object_), "BYTES"),
            _tensor("exclude_input_in_output", true, "BOOL"),
            _tensor("return_finish_reason", true, "BOOL"),
            _tensor("return_num_input_tokens", true, "BOOL"),
            _tensor("return_num_output_tokens", true, "BOOL"),
        ]
    return [
        text,
        _tensor("streaming", np.array([stream]), "BOOL"),
        _tensor("sampling_param_max_tokens", np.array([max_tokens], dtype=np.int32), "INT32"),
        _tensor("sampling_param_exclude_input_from_output", true, "BOOL"),
        _tensor("sampling_param_return_perf_metrics", true, "BOOL"),
        _tensor("return_finish_reason", true, "BOOL"),
    ]


async def direct_call(
    client: triton_grpc.InferenceServerClient, model: str, stream: bool, max_tokens: int
) -> int:
    """One request straight to Triton; returns the responses that carried text."""

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {
            "model_name": model,
            "inputs": direct_inputs(model, stream, max_tokens),
            "enable_empty_final_response": True,
        }

    chunks = 0
    async for result, error in client.stream_infer(requests()):
        assert error is None, error
        text = result.as_numpy("text_output")
        chunks += text is not None and bool(text[0])
    return chunks


# -- through the gateway -------------------------------------------------------------------


async def gateway_call(http: httpx.AsyncClient, model: str, max_tokens: int) -> int:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens}
    response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return 1


async def gateway_stream(http: httpx.AsyncClient, model: str, max_tokens: int) -> int:
    """One streamed completion; returns its chunks with text."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "stream": True}
    chunks = 0
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            chunks += line.startswith("data: {") and '"text":"' in line and '"text":""' not in line
    return chunks


async def load(call: Callable[[], Awaitable[int]], concurrency: int, total: int) -> int:
    """``total`` calls, ``concurrency`` at a time; the sum of what they return."""
    remaining, counted = total, 0

    async def worker() -> None:
        nonlocal remaining, counted
        while remaining > 0:
            remaining -= 1
            got = await call()
            counted += got

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counted


async def measured(
    pid: int, call: Callable[[], Awaitable[int]], concurrency: int, total: int
) -> Run:
    before, start = cpu_seconds(pid), time.perf_counter()
    chunks = await load(call, concurrency, total)
    return Run(time.perf_counter() - start, cpu_seconds(pid) - before, chunks)


async def latency_ms(call: Callable[[], Awaitable[int]]) -> float:
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


# -- the measures --------------------------------------------------------------------------


async def check_usage(http: httpx.AsyncClient) -> list[str]:
    """Both models write the same words; only the LLM API's usage is estimated."""
    texts, rows = [], []
    for model in MODELS:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 16}
        answer = (await http.post("/v1/completions", json=body)).json()
        texts.append(answer["choices"][0]["text"])
        usage = answer["usage"]
        assert bool(usage.get("estimated")) == (model == "trtllm_llmapi"), answer
        rows.append(
            f"{usage['prompt_tokens']} + {usage['completion_tokens']}"
            + (" (estimated)" if usage.get("estimated") else " (the model's)")
        )
    assert texts[0] == texts[1], texts
    return [
        f"| usage of the 16-token answer (prompt + completion tokens) | {rows[0]} | {rows[1]} | - |"
    ]


async def latency_rows(
    http: httpx.AsyncClient, client: triton_grpc.InferenceServerClient, count: int, rounds: int
) -> list[str]:
    sides: dict[tuple[str, str], list[float]] = {}
    calls: dict[tuple[str, str], Callable[[], Awaitable[int]]] = {}
    for model in MODELS:
        calls[model, "gateway"] = lambda m=model: gateway_call(http, m, 16)  # type: ignore[misc]
        calls[model, "direct"] = lambda m=model: direct_call(client, m, False, 16)  # type: ignore[misc]
    for key, call in calls.items():
        sides[key] = []
        await load(call, 1, max(20, count // 10))  # warm
    for _ in range(rounds):
        for key, call in calls.items():
            for _ in range(max(1, count // rounds)):
                sides[key].append(await latency_ms(call))
    p = {key: pct(values, 50) for key, values in sides.items()}
    added = {m: p[m, "gateway"] - p[m, "direct"] for m in MODELS}
    a, b = MODELS
    return [
        f"| non-streaming p50, 16 tokens, through the gateway | {p[a, 'gateway']:.2f} ms | "
        f"{p[b, 'gateway']:.2f} ms | **{p[b, 'gateway'] / p[a, 'gateway']:.2f}** |",
        f"| (reference) the same straight to Triton (tritonclient gRPC) | "
        f"{p[a, 'direct']:.2f} ms | {p[b, 'direct']:.2f} ms | "
        f"{p[b, 'direct'] / p[a, 'direct']:.2f} |",
        f"| the gateway's added p50 (usage estimated for the LLM API) | {added[a]:+.2f} ms | "
        f"{added[b]:+.2f} ms | {added[b] - added[a]:+.2f} ms |",
    ]


async def stream_rows(
    stack: GatewayProcess,
    http: httpx.AsyncClient,
    client: triton_grpc.InferenceServerClient,
    scale: float,
    rounds: int,
) -> list[str]:
    pid = stack.process.pid if stack.process else 0
    long_n = max(CONCURRENCY, round(8 * scale))  # 512-token streams per round
    short_n = max(CONCURRENCY, round(32 * scale))  # 64- and 1-token streams per round
    runs = {(m, kind): Run() for m in MODELS for kind in ("512", "64", "1", "direct")}
    for model in MODELS:  # warm
        await load(lambda m=model: gateway_stream(http, m, 64), CONCURRENCY, CONCURRENCY)  # type: ignore[misc]
    for _ in range(rounds):
        for model in MODELS:
            for kind, tokens, total in (
                ("512", 512, long_n),
                ("64", 64, short_n),
                ("1", 1, short_n),
            ):
                run = await measured(
                    pid,
                    lambda m=model, t=tokens: gateway_stream(http, m, t),  # type: ignore[misc]
                    CONCURRENCY,
                    total,
                )
                runs[model, kind].add(run)
            run = await measured(
                pid,
                lambda m=model: direct_call(client, m, True, 512),  # type: ignore[misc]
                CONCURRENCY,
                long_n,
            )
            runs[model, "direct"].add(run)

    def rate(model: str, kind: str) -> float:
        return runs[model, kind].chunks / runs[model, kind].wall

    def per_chunk_us(model: str, kind: str) -> float:
        # The same number of 1-token streams per 64-token run; scaled for the 512-token runs.
        long, short = runs[model, kind], runs[model, "1"]
        share = long_n / short_n if kind == "512" else 1.0
        return (long.cpu - short.cpu * share) / (long.chunks - short.chunks * share) * 1e6

    a, b = MODELS
    g = {m: rate(m, "512") for m in MODELS}
    d = {m: rate(m, "direct") for m in MODELS}
    cpu = {(m, k): per_chunk_us(m, k) for m in MODELS for k in ("64", "512")}
    return [
        f"| streamed chunks/s through the gateway, 512 tokens, {CONCURRENCY} streams | "
        f"{g[a]:,.0f} /s | {g[b]:,.0f} /s | **{g[b] / g[a]:.2f}** |",
        f"| (reference) the same straight to Triton | {d[a]:,.0f} /s | {d[b]:,.0f} /s | "
        f"{d[b] / d[a]:.2f} |",
        f"| gateway CPU per streamed chunk, 64-token streams | {cpu[a, '64']:.0f} µs | "
        f"{cpu[b, '64']:.0f} µs | **{cpu[b, '64'] / cpu[a, '64']:.2f}** |",
        f"| gateway CPU per streamed chunk, 512-token streams | {cpu[a, '512']:.0f} µs | "
        f"{cpu[b, '512']:.0f} µs | **{cpu[b, '512'] / cpu[a, '512']:.2f}** |",
    ]


async def recorded(
    client: triton_grpc.InferenceServerClient, model: str, tokens: int
) -> tuple[Contract, list[service_pb2.ModelInferResponse]]:
    """The model's contract (from the config Triton serves) and the responses of one stream
    of ``tokens`` tokens straight from it, to replay in process."""
    served = await client.get_model_config(model, as_json=True)
    contract = contract_for(ModelConfig.from_json(model, served["config"]))
    assert contract is not None, model

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": model, "inputs": direct_inputs(model, True, tokens)}

    messages = []
    async for result, error in client.stream_infer(requests()):
        assert error is None, error
        messages.append(result.get_response())
    return contract, messages


def per_response_us(
    contract: Contract, messages: list[service_pb2.ModelInferResponse], at: tuple[int, ...]
) -> list[float]:
    """The gateway's work on each response of a recorded stream, in process: reading it
    (``Outputs``, ``TextReader.read``) and the engine's metrics (``engine_stats``, observed
    into a registry of its own as the backend does). Microseconds per response around the
    ``at``-th ones (the mean of 16), best of several replays."""
    metrics = Metrics()
    _, rules = contract.generate(PROMPT, SamplingOptions(max_tokens=len(messages)), True)
    best = [float("inf")] * len(at)
    for _ in range(REPLAYS):
        reader = contract.reader(PROMPT, rules)
        times = []
        for message in messages:
            start = time.perf_counter()
            outputs = streams.Outputs(message, final=False)
            reader.read(outputs)
            stats = contract.engine_stats(outputs)
            if stats:
                metrics.engine(contract.config.name, stats)
            times.append(time.perf_counter() - start)
        for i, n in enumerate(at):
            window = times[max(0, n - 8) : n + 8]
            best[i] = min(best[i], sum(window) / len(window) * 1e6)
    return best


async def replay_rows(client: triton_grpc.InferenceServerClient) -> list[str]:
    at = (64, 512, REPLAY_TOKENS - 1)
    found = {}
    for model in MODELS:
        contract, messages = await recorded(client, model, REPLAY_TOKENS)
        assert len(messages) >= REPLAY_TOKENS, (model, len(messages))
        found[model] = per_response_us(contract, messages, at)
    a, b = MODELS
    return [
        f"| gateway's work per streamed response in process, at the {n}th token "
        f"(read + engine metrics) | {found[a][i]:.1f} µs | {found[b][i]:.1f} µs | "
        f"{found[b][i] / found[a][i]:.2f} |"
        for i, n in enumerate(at)
    ]


async def observations_row(http: httpx.AsyncClient, streams_n: int, tokens: int) -> str:
    """Observations of the engine's KV-cache histogram added by ``streams_n`` streamed
    requests of ``tokens`` tokens on the LLM API model."""
    pattern = re.compile(
        r'^gateway_engine_kv_cache_hit_ratio_count\{model="trtllm_llmapi"\} (\S+)$', re.M
    )

    async def count() -> float:
        found = pattern.search((await http.get("/metrics")).text)
        return float(found.group(1)) if found else 0.0

    before = await count()
    for _ in range(streams_n):
        await gateway_stream(http, "trtllm_llmapi", tokens)
    per_request = (await count() - before) / streams_n
    told = "one per request" if round(per_request) == 1 else f"{per_request:.0f} per request"
    return (
        f"| engine metric observations per streamed request ({tokens} tokens) | - | "
        f"{per_request:.0f} | {told} |"
    )


async def run(stack: GatewayProcess, scale: float) -> list[str]:
    rows: list[str] = []
    rounds = max(2, round(4 * scale))
    client = triton_grpc.InferenceServerClient(stack.triton_grpc)
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(
        base_url=stack.base_url, timeout=120, limits=limits, headers=stack.user_headers()
    ) as http:
        rows += await latency_rows(http, client, max(rounds, round(300 * scale)), rounds)
        print(*rows, sep="\n", flush=True)
        rows += await check_usage(http)
        print(rows[-1], flush=True)
        rows += await stream_rows(stack, http, client, scale, rounds)
        print(*rows[-4:], sep="\n", flush=True)
        rows.append(await observations_row(http, 4, 64))
        print(rows[-1], flush=True)
        rows += await replay_rows(client)
        print(*rows[-3:], sep="\n", flush=True)
    await client.close()
    return rows


def main() -> None:
    args = options(__doc__)
    header = [
        "| measure | mock_chat (vLLM tensors) | trtllm_llmapi | ratio |",
        "| --- | --- | --- | --- |",
    ]
    print(*header, sep="\n", flush=True)
    rows = rows_on_stack(list(MODELS), run, args.scale)
    write_table(args.out, header + rows)


if __name__ == "__main__":
    main()
