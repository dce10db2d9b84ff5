"""Latency against Triton itself and against other gateways, in one run.

Run with ``make bench`` (or ``python -m tests.bench.peers``). It starts the stack ``make run``
starts (nginx in front of two replicas) with the weightless ``mock_chat`` model, a replica of
older code beside it (``--baseline``, as in ``tests/bench/cpu.py``), and two other gateways
that front Triton: **Portkey** (``@portkey-ai/gateway``, node; its Triton provider posts
``/generate``) and **LiteLLM** (its proxy; the ``triton/`` provider posts ``/generate`` too).
They are installed on first use under ``~/.cache/triton-gateway/peers`` (npm and pip, from
the registries; a peer that cannot be installed is left out with a line saying why).

Every path makes the same completion: the prompt ``[mock:words=16] ...`` makes ``mock_chat``
answer 16 words whatever the path sends as ``max_tokens``. Requests go one at a time, the
paths in turn (round-robin, so a busy moment of the shared machine falls on all of them);
the table shows each path's p50 and p99 and what it adds over the Triton endpoint it calls
(gRPC for this gateway, HTTP ``/generate`` for the peers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import tritonclient.grpc.aio as triton_grpc

from gateway.stack.triton_server import free_port
from tests.bench import write_table
from tests.bench.chat import direct_call, pct
from tests.bench.cpu import BASELINE, baseline_replica, running
from tests.support.stack import GatewayProcess

PROMPT = "[mock:words=16] Tell me about the quick brown fox."
PEERS = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "triton-gateway" / "peers"
PORTKEY = "@portkey-ai/gateway@1.15.2"
LITELLM = "litellm[proxy]"
LITELLM_KEY = "sk-" + secrets.token_hex(24)

Call = Callable[[], Awaitable[None]]


def _ready(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


@contextmanager
def portkey() -> Iterator[str | None]:
    """Portkey's gateway on a free port (its base URL), or None if it cannot be had."""
    home = PEERS / "portkey"
    server = home / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    if not server.exists() and shutil.which("npm"):
        home.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(home), PORTKEY],
            check=False,
            capture_output=True,
        )
    if not server.exists() or not shutil.which("node"):
        print(f"Portkey left out: could not install {PORTKEY} with npm", file=sys.stderr)
        yield None
        return
    port = free_port()
    command = ["node", str(server), f"--port={port}", "--headless"]
    with running(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        _ready(f"http://127.0.0.1:{port}/")
        yield f"http://127.0.0.1:{port}"


@contextmanager
def litellm(triton_http: str) -> Iterator[str | None]:
    """LiteLLM's proxy in front of mock_chat on a free port (its base URL), or None. It
    takes :data:`LITELLM_KEY` (it refuses to start without a master key)."""
    venv = PEERS / "litellm-venv"
    binary = venv / "bin" / "litellm"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", LITELLM], check=False, capture_output=True
        )
    if not binary.exists():
        print(f"LiteLLM left out: could not install {LITELLM} with pip", file=sys.stderr)
        yield None
        return
    port = free_port()
    api_base = f"{triton_http}/v2/models/mock_chat/generate"
    command = [str(binary), "--model", "triton/mock_chat", "--api_base", api_base,
               "--port", str(port), "--num_workers", "1"]  # fmt: skip
    env = {**os.environ, "LITELLM_MASTER_KEY": LITELLM_KEY}
    with running(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env):
        _ready(f"http://127.0.0.1:{port}/health/liveliness")
        yield f"http://127.0.0.1:{port}"


def completion(http: httpx.AsyncClient, path: str = "/v1/completions", **extra: object) -> Call:
    body = {"model": "mock_chat", "prompt": PROMPT, "max_tokens": 16, **extra}

    async def call() -> None:
        response = await http.post(path, json=body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"].strip()

    return call


async def measure(paths: dict[str, Call], rounds: int) -> dict[str, list[float]]:
    """Each path's latencies (ms), the paths called in turn, one request at a time."""
    for call in paths.values():
        for _ in range(20):
            await call()  # warm: connections, caches
    seen: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, call in paths.items():
            started = time.perf_counter()
            await call()
            seen[name].append((time.perf_counter() - started) * 1000)
    return seen


async def run(
    stack: GatewayProcess,
    baseline: tuple[int, str] | None,
    portkey_url: str | None,
    litellm_url: str | None,
    rounds: int,
) -> list[str]:
    triton_http = f"http://127.0.0.1:{stack.http_port}"
    address = stack.replica_addresses()[0]
    user = stack.user_headers()
    grpc_client = triton_grpc.InferenceServerClient(stack.triton_grpc)
    clients = [
        httpx.AsyncClient(base_url=triton_http, timeout=30),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=30, headers=stack.headers),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=30, headers=user),
        httpx.AsyncClient(base_url=stack.base_url, timeout=30, headers=user),
    ]
    http_direct, admin, one_replica, nginx = clients

    async def grpc_direct() -> None:
        await direct_call(grpc_client, False, 16)  # its own prompt: 16 tokens too

    async def triton_generate() -> None:
        body = {"text_input": PROMPT, "sampling_parameters": json.dumps({"max_tokens": 16})}
        response = await http_direct.post("/v2/models/mock_chat/generate", json=body)
        assert response.status_code == 200 and "text_output" in response.json(), response.text

    paths: dict[str, Call] = {
        "Triton gRPC direct": grpc_direct,
        "Triton HTTP direct (/generate)": triton_generate,
        "gateway, one replica, admin key": completion(admin),
        "gateway, one replica, user key (limits on)": completion(one_replica),
        "gateway through nginx, user key": completion(nginx),
    }
    if baseline is not None:
        before = httpx.AsyncClient(base_url=f"http://{baseline[1]}", timeout=30, headers=user)
        clients.append(before)
        paths[f"gateway before ({BASELINE}), one replica, user key"] = completion(before)
    if portkey_url is not None:
        headers = {
            "x-portkey-provider": "triton",
            "x-portkey-custom-host": f"{triton_http}/v2/models/mock_chat",
        }
        clients.append(httpx.AsyncClient(base_url=portkey_url, timeout=30, headers=headers))
        paths["Portkey 1.15.2, to Triton HTTP"] = completion(clients[-1])
    if litellm_url is not None:
        key = {"Authorization": f"Bearer {LITELLM_KEY}"}
        clients.append(httpx.AsyncClient(base_url=litellm_url, timeout=30, headers=key))
        paths["LiteLLM proxy, to Triton HTTP"] = completion(clients[-1], model="triton/mock_chat")
    try:
        seen = await measure(paths, rounds)
    finally:
        for client in clients:
            await client.aclose()
        await grpc_client.close()
    grpc_p50 = pct(seen["Triton gRPC direct"], 50)
    http_p50 = pct(seen["Triton HTTP direct (/generate)"], 50)
    rows = []
    for name, values in seen.items():
        p50 = pct(values, 50)
        if name.startswith("Triton"):
            added = "—"
        elif name.startswith(("Portkey", "LiteLLM")):
            added = f"+{p50 - http_p50:.2f} ms over HTTP"
        else:
            added = f"**+{p50 - grpc_p50:.2f} ms** over gRPC"
        rows.append(f"| {name} | {p50:.2f} | {pct(values, 99):.2f} | {added} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=400, help="requests per path")
    parser.add_argument("--baseline", default=BASELINE, help="git ref, or 'none'")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    ref = None if args.baseline == "none" else args.baseline
    header = [
        "| path (concurrency 1, 16 words) | p50 ms | p99 ms | added over its own backend |",
        "| --- | --- | --- | --- |",
    ]
    stack = GatewayProcess(models=["mock_chat"]).start()
    try:
        stack.wait_ready()
        with ExitStack() as context:
            baseline = context.enter_context(baseline_replica(stack, ref)) if ref else None
            portkey_url = context.enter_context(portkey())
            litellm_url = context.enter_context(litellm(f"http://127.0.0.1:{stack.http_port}"))
            if baseline is not None:
                _ready(f"http://{baseline[1]}/health/ready")
            rows = asyncio.run(run(stack, baseline, portkey_url, litellm_url, args.rounds))
    finally:
        stack.stop()
    print(*header, *rows, sep="\n", flush=True)
    write_table(args.out, header + rows)


if __name__ == "__main__":
    main()
