"""smollm2 continuous-batching benchmark: four users at once against one user alone.

Run with ``make bench`` (or ``python -m tests.bench.batching``). It starts the real stack on
free ports (Triton with ``smollm2`` only, one gateway process, no nginx) and calls Triton
directly over gRPC streaming (``tritonclient.grpc.aio``), the tensors the gateway sends, so
the numbers are the model's own:

- a lone user: time to first token (TTFT) and tokens/s (the tokens of the answer over the
  request's whole time, TTFT included), the median over four different prompts;
- four users at once, each with another prompt: the worst TTFT among them against the lone
  one (goal <= 2x), and the aggregate tokens/s (all answers' tokens over the wall time until
  the last one ends) against the lone one (goal >= 1.5x);
- whether every greedy answer given together equals the same prompt's answer alone.

``--repository DIR`` serves another copy of ``triton_repo``; ``--baseline DIR`` starts a second
stack on another copy (say, with an older ``model.py``) and measures both in alternating
rounds, one stack at a time, so both see the same machine. Everything shares one 2-core
machine; compare ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc.aio as triton_grpc

from tests.bench import write_table
from tests.support.stack import GatewayProcess

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = [
    "Write a long story about a dragon.",
    "Explain how a bicycle works, in detail.",
    "Describe the city of Paris to a tourist.",
    "Write a poem about the sea and the wind.",
]
MAX_TOKENS = 64
USERS = 4


def render(question: str) -> str:
    """The prompt the gateway renders for one user message (smollm2's ChatML template)."""
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@dataclass
class Answer:
    ttft: float  # seconds from the call to the first text
    elapsed: float  # seconds from the call to the final response
    tokens: int
    text: str


def _inputs(prompt: str) -> list[triton_grpc.InferInput]:
    def tensor(name: str, value: np.ndarray, datatype: str) -> triton_grpc.InferInput:
        item = triton_grpc.InferInput(name, [1], datatype)
        item.set_data_from_numpy(value)
        return item

    params = json.dumps({"max_tokens": MAX_TOKENS, "temperature": 0}).encode()
    true = np.array([True])
    return [
        tensor("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        tensor("stream", true, "BOOL"),
        tensor("sampling_parameters", np.array([params], dtype=np.object_), "BYTES"),
        tensor("exclude_input_in_output", true, "BOOL"),
        tensor("return_num_output_tokens", true, "BOOL"),
    ]


async def ask(client: triton_grpc.InferenceServerClient, prompt: str) -> Answer:
    """One streamed greedy answer, read to its final response."""

    async def requests():  # type: ignore[no-untyped-def]
        yield {
            "model_name": "smollm2",
            "inputs": _inputs(prompt),
            "enable_empty_final_response": True,
        }

    start = time.perf_counter()
    ttft, tokens, text = 0.0, 0, ""
    async for result, error in client.stream_infer(requests()):
        assert error is None, error
        piece = result.as_numpy("text_output")
        if piece is not None and piece.size and piece[0]:
            text += piece[0].decode()
            ttft = ttft or time.perf_counter() - start
        counted = result.as_numpy("num_output_tokens")
        if counted is not None and counted.size:
            tokens += int(counted[0])
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    return Answer(ttft, time.perf_counter() - start, tokens, text)


@dataclass
class Runs:
    """What one stack measured, round after round."""

    lone_ttft: list[float] = field(default_factory=list)
    lone_rate: list[float] = field(default_factory=list)
    together_ttft: list[float] = field(default_factory=list)
    together_rate: list[float] = field(default_factory=list)
    alone: dict[str, str] = field(default_factory=dict)
    identical: bool = True

    async def round(self, client: triton_grpc.InferenceServerClient, prompts: list[str]) -> None:
        """Each prompt alone, one after another, then all of them at once."""
        for prompt in prompts:
            answer = await ask(client, prompt)
            self.lone_ttft.append(answer.ttft)
            self.lone_rate.append(answer.tokens / answer.elapsed)
            self.alone.setdefault(prompt, answer.text)
            self.identical &= self.alone[prompt] == answer.text
        start = time.perf_counter()
        answers = await asyncio.gather(*(ask(client, p) for p in prompts))
        wall = time.perf_counter() - start
        self.together_ttft.append(max(a.ttft for a in answers))
        self.together_rate.append(sum(a.tokens for a in answers) / wall)
        self.identical &= all(
            self.alone[p] == a.text for p, a in zip(prompts, answers, strict=True)
        )

    def cells(self) -> list[str]:
        ttft, ttft4 = statistics.median(self.lone_ttft), statistics.median(self.together_ttft)
        rate, rate4 = statistics.median(self.lone_rate), statistics.median(self.together_rate)
        return [
            f"{ttft * 1000:.0f} ms",
            f"{rate:.1f} tok/s",
            f"{ttft4 * 1000:.0f} ms, **{ttft4 / ttft:.2f}x** lone",
            f"{rate4:.1f} tok/s, **{rate4 / rate:.2f}x** lone",
            "yes" if self.identical else "NO",
        ]


MEASURES = [
    ("lone user: TTFT", 1, "-"),
    ("lone user: tokens/s", 1, "-"),
    (f"worst TTFT of {USERS} users", USERS, "<= 2x lone"),
    (f"aggregate tokens/s of {USERS} users", USERS, ">= 1.5x lone"),
    ("greedy answers together == alone", USERS, "yes"),
]


async def measure(stacks: dict[str, GatewayProcess], rounds: int) -> list[str]:
    """The table: a column per stack, measured in alternating rounds (so a drift in the
    speed of the shared machine hits every stack alike)."""
    prompts = [render(q) for q in QUESTIONS[:USERS]]
    clients = {name: triton_grpc.InferenceServerClient(s.triton_grpc) for name, s in stacks.items()}
    runs = {name: Runs() for name in stacks}
    try:
        for client in clients.values():
            await ask(client, prompts[0])  # warm up: first decode, caches
        for _ in range(rounds):
            for name, client in clients.items():
                await runs[name].round(client, prompts)
    finally:
        for client in clients.values():
            await client.close()
    columns = [r.cells() for r in runs.values()]
    rows = [
        f"| smollm2, greedy, {MAX_TOKENS} tokens | users | {' | '.join(stacks)} | goal |",
        "| --- | --- |" + " --- |" * len(stacks) + " --- |",
    ]
    for i, (measure, users, goal) in enumerate(MEASURES):
        rows.append(f"| {measure} | {users} | {' | '.join(c[i] for c in columns)} | {goal} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="lone + together rounds")
    parser.add_argument("--repository", help="serve this Triton model repository instead")
    parser.add_argument(
        "--baseline", help="also serve this model repository (e.g. an older model.py) and compare"
    )
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    repositories = {"measured": args.repository}
    if args.baseline:
        repositories = {"baseline": args.baseline, "this tree": args.repository}
    stacks = {
        name: GatewayProcess(
            models=["smollm2"],
            nginx=False,
            env={"GATEWAY_MODEL_REPOSITORY": repo} if repo else {},
        ).start()
        for name, repo in repositories.items()
    }
    try:
        for stack in stacks.values():
            stack.wait_ready()
        rows = asyncio.run(measure(stacks, args.rounds))
    finally:
        for stack in stacks.values():
            stack.stop()
    print(*rows, sep="\n", flush=True)
    write_table(args.out, rows)


if __name__ == "__main__":
    main()
