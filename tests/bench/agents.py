"""Agent features benchmark: structured outputs, tool-call parsing, n choices.

Run with ``make bench`` (or ``python -m tests.bench.agents``). It starts the real stack on
free ports (one gateway replica, no nginx) and measures, each pair in the same run and in
alternating rounds:

- SmolLM2 decode tokens/s with a JSON-schema ``response_format`` against the same request
  without one, through the gateway (the goal is >= 0.8x); for reference, the same pair on
  llama-cpp-python in this process with its stock grammar sampler, which applies the grammar
  to the whole vocabulary on every step (what smollm2 did before it checked the drawn
  token first);
- what tool-call parsing costs: the hermes parser's own time per request in this process,
  and the p50 latency of a mock_chat request whose text is parsed into a call against the
  same text answered without tools;
- what storing a ``/v1/responses`` response in Redis adds (``store`` true vs false);
- ``n=4`` in one request against four requests one after another: on mock_chat with a
  5 ms per-token delay (a model that decodes sequences side by side) and on smollm2 (its
  sequences decode in one llama.cpp batch; ``tests/bench/batching.py`` measures that).
"""

from __future__ import annotations

import json
import os
import statistics
import time
import timeit
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from gateway.serving.tool_parsers import assemble, get_parser
from tests.bench import options, rows_on_stack, write_table
from tests.bench.chat import pct
from tests.support.smollm2 import weights_path
from tests.support.stack import GatewayProcess

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "hobbies": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}
ASK = "Describe a person named Alice as JSON with her name, age and hobbies."
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL_TEXT = (
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
    "</tool_call>"
)


async def decode_rate(http: httpx.AsyncClient, body: dict[str, Any]) -> float:
    """Tokens/s after the first streamed text (prompt processing excluded), counted from
    the usage the stream ends with."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    first, tokens = 0.0, 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return (tokens - 1) / (time.perf_counter() - first)


async def constrained_rows(http: httpx.AsyncClient, rounds: int) -> list[str]:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": ASK}],
        "max_tokens": 96,
        "temperature": 0,
    }
    free, bound = [], []
    await decode_rate(http, body)  # warm the grammar cache and the model
    await decode_rate(http, {**body, "response_format": SCHEMA_FORMAT})
    for _ in range(rounds):
        free.append(await decode_rate(http, body))
        bound.append(await decode_rate(http, {**body, "response_format": SCHEMA_FORMAT}))
    f, b = statistics.median(free), statistics.median(bound)
    return [
        f"| SmolLM2 decode tokens/s, JSON schema vs free (gateway) | {f:.1f} tok/s | "
        f"{b:.1f} tok/s | ratio **{b / f:.2f}** (goal >= 0.8) |"
    ]


def stock_grammar_row(rounds: int) -> str:
    """llama-cpp-python's ``generate`` with and without its grammar sampler, in process."""

    from llama_cpp import Llama, LlamaGrammar

    path = weights_path()
    llm = Llama(model_path=path, n_ctx=2048, n_threads=os.cpu_count(), verbose=False)
    grammar = LlamaGrammar.from_json_schema(json.dumps(PERSON), verbose=False)
    prompt = f"<|im_start|>user\n{ASK}<|im_end|>\n<|im_start|>assistant\n"
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)

    def rate(with_grammar: bool) -> float:
        llm.reset()
        first, count = 0.0, 0
        for _ in llm.generate(
            tokens,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            temp=0.0,
            repeat_penalty=1.0,
            reset=False,
            grammar=grammar if with_grammar else None,
        ):
            count += 1
            first = first or time.perf_counter()
            if count == 64:
                break
        return (count - 1) / (time.perf_counter() - first)

    free, bound = [], []
    for _ in range(rounds):
        free.append(rate(False))
        bound.append(rate(True))
    f, b = statistics.median(free), statistics.median(bound)
    return (
        f"| (reference) llama-cpp-python's stock grammar sampler, in process | {f:.1f} tok/s | "
        f"{b:.1f} tok/s | ratio {b / f:.2f} |"
    )


def parser_cost_us() -> tuple[float, float]:
    """The hermes parser's time per request: fed token-sized pieces (as a stream) and the
    whole text at once, in microseconds."""
    pieces = [CALL_TEXT[i : i + 3] for i in range(0, len(CALL_TEXT), 3)]
    tools = frozenset({"get_weather"})
    parser_class = get_parser("hermes")
    assert parser_class is not None

    def streamed() -> None:
        parser = parser_class(tools)
        for piece in pieces:
            parser.feed(piece)
        parser.finish()

    def whole() -> None:
        assemble(parser_class(tools), CALL_TEXT)

    runs = 2000
    return (
        min(timeit.repeat(streamed, number=runs, repeat=5)) / runs * 1e6,
        min(timeit.repeat(whole, number=runs, repeat=5)) / runs * 1e6,
    )


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


async def post(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def parsing_rows(http: httpx.AsyncClient, count: int) -> list[str]:
    say = "[mock:say=" + urllib.parse.quote(CALL_TEXT) + "]"
    plain = {"model": "mock_chat", "messages": [{"role": "user", "content": say}]}
    tools = {**plain, "tools": [WEATHER]}
    reply = await post(http, tools)
    assert reply["choices"][0]["message"]["tool_calls"], reply  # the text became a call
    without, parsed = [], []
    for _ in range(count // 2):
        await post(http, plain)  # warm
    for _ in range(count):
        without.append(await timed(lambda: post(http, plain)))
        parsed.append(await timed(lambda: post(http, tools)))
    streamed_us, whole_us = parser_cost_us()
    w, p = pct(without, 50), pct(parsed, 50)
    return [
        f"| hermes parser per request, in process (streamed in 3-char pieces / whole) | - | "
        f"{streamed_us:.0f} µs / {whole_us:.0f} µs | |",
        f"| mock_chat p50 latency, same text as content vs parsed into a call | {w:.2f} ms | "
        f"{p:.2f} ms | added **{p - w:+.2f} ms** |",
    ]


async def storage_row(http: httpx.AsyncClient, count: int) -> str:
    """What keeping a Responses response in Redis adds: store=true against store=false."""

    async def respond(store: bool) -> None:
        body = {"model": "mock_chat", "input": "hello there", "store": store}
        response = await http.post("/v1/responses", json=body)
        assert response.status_code == 200, response.text

    for _ in range(count // 4):
        await respond(True)
        await respond(False)
    kept, not_kept = [], []
    for _ in range(count):
        not_kept.append(await timed(lambda: respond(False)))
        kept.append(await timed(lambda: respond(True)))
    k, n = pct(kept, 50), pct(not_kept, 50)
    return (
        f"| /v1/responses p50 latency on mock_chat, store=false vs store=true | {n:.2f} ms | "
        f"{k:.2f} ms | Redis storage adds **{k - n:+.2f} ms** |"
    )


async def n_rows(http: httpx.AsyncClient, model: str, body: dict[str, Any], rounds: int) -> str:
    single = {**body, "model": model}
    joint = {**single, "n": 4}
    reply = await post(http, joint)
    assert len(reply["choices"]) == 4, reply

    async def sequential() -> None:
        for _ in range(4):
            await post(http, single)

    apart, together = [], []
    for _ in range(rounds):
        apart.append(await timed(sequential))
        together.append(await timed(lambda: post(http, joint)))
    a, t = statistics.median(apart), statistics.median(together)
    return (
        f"| {model}: 4 sequential requests vs one with n=4 ({body['max_tokens']} tokens each) | "
        f"{a:.0f} ms | {t:.0f} ms | n=4 takes **{t / a:.2f}x** the time |"
    )


async def gateway_rows(stack: GatewayProcess, scale: float) -> list[str]:
    rows: list[str] = []
    rounds = max(2, round(6 * scale))
    async with httpx.AsyncClient(
        base_url=stack.base_url, timeout=300, headers=stack.user_headers()
    ) as http:
        rows += await constrained_rows(http, rounds)
        print(rows[-1], flush=True)
        rows += await parsing_rows(http, int(200 * scale))
        print(*rows[-2:], sep="\n", flush=True)
        rows.append(await storage_row(http, int(200 * scale)))
        print(rows[-1], flush=True)
        slow = [{"role": "user", "content": "[mock:delay_ms=5] [mock:words=32] hello"}]
        rows.append(await n_rows(http, "mock_chat", {"messages": slow, "max_tokens": 32}, rounds))
        print(rows[-1], flush=True)
        story = [{"role": "user", "content": "Write a short story about a dragon."}]
        body = {"messages": story, "max_tokens": 32, "temperature": 0.7, "seed": 1}
        rows.append(await n_rows(http, "smollm2", body, rounds))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    args = options(__doc__)
    header = [
        "| measure | baseline | with the feature | ratio / cost |",
        "| --- | --- | --- | --- |",
    ]
    print(*header, sep="\n", flush=True)
    rows = rows_on_stack(["mock_chat", "smollm2"], gateway_rows, args.scale)
    rows.append(stock_grammar_row(max(2, round(3 * args.scale))))
    print(rows[-1], flush=True)
    write_table(args.out, header + rows)


if __name__ == "__main__":
    main()
