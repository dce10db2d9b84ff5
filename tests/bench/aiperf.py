"""NVIDIA's benchmark client, aiperf, against the gateway: its ``chat`` endpoint type
(``/v1/chat/completions``) beside its ``messages`` type (Anthropic's ``/v1/messages``, with
``x-api-key``), on mock_chat and one replica (no nginx), the same prompts, streamed, with
the rounds alternating.

aiperf (pinned in the Makefile, ``AIPERF_VERSION``) runs from its own virtualenv,
``.venv-aiperf``, which ``make bench`` makes (``make .venv-aiperf/.installed`` alone, to run
this module by itself): it brings pandas, transformers, dash and more, none of which the
gateway or its tests need. It counts tokens as the server reports them
(``--use-server-token-count``: mock_chat's tokens are words), and generates nothing: its
dataset is a file of prompts that ask mock_chat for a long answer, cut by ``--osl``. The
tokenizer it still loads is the byte tokenizer the stand-ins' tests mount, from a folder (it
may not download one).

Run with ``python -m tests.bench.aiperf`` (part of ``make bench``).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import httpx

from tests.bench import table_on_stack
from tests.bench.messages import call, load
from tests.support.shared_stack import byte_tokenizer
from tests.support.stack import ROOT, GatewayProcess

AIPERF = ROOT / ".venv-aiperf" / "bin" / "aiperf"
ENDPOINTS = ("chat", "messages")
CONCURRENCY = 8
OUTPUT_TOKENS = 64
#: What the table shows of aiperf's summary (``profile_export_aiperf.json``): its metric,
#: the statistic, the unit and a label.
MEASURES = (
    ("request_throughput", "avg", "req/s", "request throughput"),
    ("output_token_throughput", "avg", "tokens/s", "output token throughput"),
    ("time_to_first_token", "p50", "ms", "time to first token, p50"),
    ("inter_token_latency", "p50", "ms", "inter-token latency, p50"),
    ("request_latency", "p50", "ms", "request latency, p50"),
    ("request_latency", "p99", "ms", "request latency, p99"),
)
HIGHER_IS_BETTER = {"request_throughput", "output_token_throughput"}


def prompts(folder: Path, count: int) -> Path:
    """aiperf's ``single_turn`` dataset: prompts whose answers run long (mock_chat's
    ``[mock:words=N]``), so that ``--osl`` is what ends them."""
    path = folder / "prompts.jsonl"
    lines = [
        json.dumps({"text": f"[mock:words=100000] Question {i}: tell me about the fox."})
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def tokenizer(folder: Path) -> Path:
    """The stand-ins' byte tokenizer (its ``tokenizer.json``), with only the class name that
    transformers' AutoTokenizer reads from a folder (it needs no template here)."""
    path = folder / "tokenizer"
    path.mkdir()
    byte_tokenizer(path)
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    return path


def profile(
    stack: GatewayProcess,
    key: str,
    endpoint: str,
    dataset: Path,
    encoder: Path,
    out: Path,
    count: int,
) -> dict[str, dict[str, float]]:
    """One aiperf run with ``key``; its summary's metrics."""
    command = [
        str(AIPERF),
        "profile",
        "--model",
        "mock_chat",
        "--url",
        stack.base_url,
        "--endpoint-type",
        endpoint,
        "--streaming",
        "--api-key",
        key,
        "--tokenizer",
        str(encoder),
        "--input-file",
        str(dataset),
        "--custom-dataset-type",
        "single_turn",
        "--osl",
        str(OUTPUT_TOKENS),
        "--use-server-token-count",
        "--concurrency",
        str(CONCURRENCY),
        "--request-count",
        str(count),
        "--warmup-request-count",
        str(CONCURRENCY),
        "--ui-type",
        "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--artifact-dir",
        str(out),
    ]
    # Not HF_HUB_OFFLINE: aiperf then looks a folder up in the hub's cache, and fails.
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"aiperf {endpoint} failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    data = json.loads((out / "profile_export_aiperf.json").read_text())
    records = data.get("records", data)
    errors = data.get("error_summary") or []
    if errors:
        raise RuntimeError(f"aiperf {endpoint}: requests failed: {errors}")
    metrics = {name: metric for name, metric in records.items() if isinstance(metric, dict)}
    # Every answer counted, each as long as --osl asked (else the two types did not do the
    # same work).
    answered = (metrics["request_count"]["avg"], metrics["output_sequence_length"]["min"])
    if answered != (count, OUTPUT_TOKENS):
        raise RuntimeError(f"aiperf {endpoint}: (answers, shortest) = {answered}")
    return metrics


async def run(stack: GatewayProcess, scale: float) -> list[str]:
    rounds = 2 * max(1, round(scale))
    count = max(CONCURRENCY * 4, round(160 * scale))
    seen: dict[str, dict[tuple[str, str], list[float]]] = {e: {} for e in ENDPOINTS}
    # A user key with limits it will not reach: every request takes the whole Redis path.
    headers = stack.user_headers()
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=120, headers=headers) as http:
        for endpoint in ENDPOINTS:  # the first requests of a fresh replica are slower
            await load(lambda e=endpoint: call(http, e, OUTPUT_TOKENS, True), count)  # type: ignore[misc]
    with tempfile.TemporaryDirectory(prefix="aiperf-") as tmp:
        folder = Path(tmp)
        dataset, encoder = prompts(folder, count), tokenizer(folder)
        key = headers["Authorization"].removeprefix("Bearer ")
        for r in range(rounds):
            # ABBA: neither endpoint type always runs first.
            for endpoint in ENDPOINTS if r % 2 == 0 else ENDPOINTS[::-1]:
                out = folder / f"{endpoint}-{r}"
                metrics = await asyncio.to_thread(
                    profile, stack, key, endpoint, dataset, encoder, out, count
                )
                for name, stat, _, _ in MEASURES:
                    value = metrics[name][stat]
                    seen[endpoint].setdefault((name, stat), []).append(float(value))
    rows = []
    for name, stat, unit, label in MEASURES:
        chat, messages = (statistics.median(seen[e][name, stat]) for e in ENDPOINTS)
        rows.append(
            f"| {label} | {chat:.1f} {unit} | {messages:.1f} {unit} | **{messages / chat:.2f}** |"
        )
    return rows


def main() -> None:
    header = [
        f"| aiperf 0.13, mock_chat, {CONCURRENCY} streams, {OUTPUT_TOKENS}-token answers "
        "| endpoint type `chat` | endpoint type `messages` | ratio |",
        "| --- | --- | --- | --- |",
    ]
    table_on_stack(__doc__, header, ["mock_chat"], run)


if __name__ == "__main__":
    main()
