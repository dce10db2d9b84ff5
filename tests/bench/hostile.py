"""Hostile-input benchmark: what an attacker's requests cost the gateway and everyone else.

Run with ``make bench`` (or ``python -m tests.bench.hostile``). It starts ``gateway up``
(nginx in front of two replicas, the default limits) on free ports. Two clients chat with
``mock_chat`` (non-streaming, 16 tokens) in alternating rounds: quiet rounds, and rounds in
which an attacker with an ordinary user key sends, one after the other, the bodies of
issue 35: a million one-letter chat messages (34 MB), JSON nested 100,000 deep, 5 MB with a
wrong key, a body over nginx's cap, an FFmpeg playlist and an SDP file as "audio". It prints
what each hostile request got and how long it took, the chatting clients' latency in both
kinds of round and their ratio, and the replicas' largest RSS growth; and, as a yardstick,
what parsing and validating the million-message body costs in this process (what the
gateway did before it measured bodies first). Client, nginx, both replicas and Triton share
one 2-core machine: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
import time
import tracemalloc
from pathlib import Path
from statistics import median

import httpx

from tests.bench import write_table
from tests.bench.chat import gateway_call, pct, spread
from tests.support.stack import GatewayProcess

MB = 1024 * 1024
CHAT = "/v1/chat/completions"


def _million_messages() -> bytes:
    one = b'{"role":"user","content":"a"},'
    return (
        b'{"model":"mock_chat","messages":[' + one * 1_000_000 + b'{"role":"user","content":"a"}]}'
    )


def _attacks(limit_mb: float) -> list[tuple[str, str, dict[str, object]]]:
    """(what, path, httpx keyword arguments) of each hostile request."""
    json_type = {"Content-Type": "application/json"}
    deep = b'{"model":"mock_chat","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    over = b'{"model":"mock_chat","x":"' + b"x" * int((limit_mb + 0.5) * MB) + b'"}'
    playlist = b"ffconcat version 1.0\nfile README.md\n"
    sdp = b"v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 0.0.0.0\nt=0 0\nm=audio 41234 RTP/AVP 0\n"
    upload = "/v1/audio/transcriptions"
    return [
        (
            "a million messages (34 MB)",
            CHAT,
            {"content": _million_messages(), "headers": json_type},
        ),
        ("JSON nested 100,000 deep", CHAT, {"content": deep, "headers": json_type}),
        (
            "5 MB with a wrong key",
            CHAT,
            {
                "content": b" " * (5 * MB),
                "headers": {**json_type, "Authorization": "Bearer sk-gw-0123456789ab-wrong"},
            },
        ),
        (
            f"a body over nginx's cap ({limit_mb + 0.5:g} MB)",
            CHAT,
            {"content": over, "headers": json_type},
        ),
        (
            "an ffconcat playlist as audio",
            upload,
            {"data": {"model": "whisper_stt"}, "files": {"file": ("a.wav", playlist)}},
        ),
        (
            "an SDP file as audio",
            upload,
            {"data": {"model": "whisper_stt"}, "files": {"file": ("a.wav", sdp)}},
        ),
    ]


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    return int(match.group(1)) / 1024 if match else 0.0


class RssWatch:
    """The largest RSS growth of some processes, sampled every 50 ms in a thread."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.start = [_rss_mb(pid) for pid in pids]
        self.most = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            growth = [_rss_mb(pid) - s for pid, s in zip(self.pids, self.start, strict=True)]
            self.most = max(self.most, *growth)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.most


async def _chatting(http: httpx.AsyncClient, stop: asyncio.Event) -> list[float]:
    latencies = []
    while not stop.is_set():
        latencies.append((await gateway_call(http, False, 16)).latency * 1000)
    return latencies


def _attack(
    base_url: str,
    headers: dict[str, str],
    attacks: list[tuple[str, str, dict[str, object]]],
    refusals: dict[str, list[tuple[int, str, float]]],
    loop: asyncio.AbstractEventLoop,
    done: asyncio.Event,
) -> None:
    """Sends every hostile request three times, from a thread of its own with its own client
    (sending 34 MB must not hold up the chatting clients' event loop), then sets ``done``."""
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as raw:
        for _ in range(3):
            for what, path, arguments in attacks:
                started = time.perf_counter()
                response = raw.post(path, **arguments)  # type: ignore[arg-type]
                elapsed = (time.perf_counter() - started) * 1000
                error = response.json().get("error", {}) if response.content else {}
                refusals[what].append((response.status_code, error.get("code", ""), elapsed))
    loop.call_soon_threadsafe(done.set)


async def hostile_benchmarks(
    stack: GatewayProcess, rounds: int
) -> tuple[list[str], list[str], list[str]]:
    headers = stack.user_headers()
    pids = [stack.replica_pid(address) for address in stack.replica_addresses()]
    attacks = _attacks(36.0)
    refusals: dict[str, list[tuple[int, str, float]]] = {what: [] for what, _, _ in attacks}
    quiet: list[float] = []
    attacked: list[float] = []
    most_rss = 0.0
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=120) as http:
        for _ in range(20):  # warm both replicas' connections
            await gateway_call(http, False, 16)
        for _ in range(rounds):
            # A quiet round of 3 s, then a round as long as the attacker's requests take.
            quiet_over = asyncio.Event()
            asyncio.get_running_loop().call_later(3.0, quiet_over.set)
            rounds_quiet = await asyncio.gather(*(_chatting(http, quiet_over) for _ in range(2)))
            quiet += [x for latencies in rounds_quiet for x in latencies]
            done = asyncio.Event()
            watch = RssWatch(pids)
            loop = asyncio.get_running_loop()
            attacker = threading.Thread(
                target=_attack, args=(stack.base_url, headers, attacks, refusals, loop, done)
            )
            attacker.start()
            results = await asyncio.gather(*(_chatting(http, done) for _ in range(2)))
            attacker.join()
            attacked += [x for latencies in results for x in latencies]
            most_rss = max(most_rss, watch.stop())
    refused = [
        f"| {what} | {sorted({f'{status} {code}' for status, code, _ in seen})[0]} | "
        f"{median(elapsed for _, _, elapsed in seen):,.0f} ms |"
        for what, seen in refusals.items()
    ]
    ratio = pct(attacked, 50) / pct(quiet, 50)
    clients = [
        f"| quiet rounds | {len(quiet)} | {spread(quiet)} |",
        f"| while attacked | {len(attacked)} | {spread(attacked)} |",
        f"| attacked / quiet, p50 | | **{ratio:.2f}** "
        f"(p99 {pct(attacked, 99) / pct(quiet, 99):.2f}) |",
        f"| replicas' largest RSS growth while attacked | | {most_rss:.0f} MB |",
    ]
    return refused, clients, _yardstick()


def _yardstick() -> list[str]:
    """What parsing and validating the million-message body costs, in this process."""
    from gateway.serving.json_shape import JsonLimits, json_shape
    from gateway.serving.protocol import ChatCompletionRequest

    body = _million_messages()
    limits = JsonLimits.defaults()
    started = time.perf_counter()
    json_shape(body, limits)
    measured = (time.perf_counter() - started) * 1000
    tracemalloc.start()
    started = time.perf_counter()
    ChatCompletionRequest.model_validate(json.loads(body))
    parsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return [
        f"| measured and refused (`json_shape`, what the gateway does now) | "
        f"{measured:,.1f} ms | - |",
        f"| parsed and validated (`json.loads` + the request model: before) | {parsed:,.2f} s | "
        f"{peak / MB:,.0f} MB |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=4, help="attack rounds (each beside a quiet one)"
    )
    parser.add_argument("--out", help="also write the tables to this file")
    args = parser.parse_args()
    stack = GatewayProcess(models=["mock_chat", "whisper_stt"]).start()
    try:
        stack.wait_ready()
        refused, clients, yardstick = asyncio.run(hostile_benchmarks(stack, args.rounds))
    finally:
        stack.stop()
    lines = [
        "| hostile request (user key) | answer | median time to the answer |",
        "| --- | --- | --- |",
        *refused,
        "",
        "| two clients chatting (`mock_chat`, 16 tokens) | requests | latency |",
        "| --- | --- | --- |",
        *clients,
        "",
        "| the million-message body, in one process | time | peak memory |",
        "| --- | --- | --- |",
        *yardstick,
    ]
    print(*lines, sep="\n", flush=True)
    write_table(args.out, lines)


if __name__ == "__main__":
    main()
