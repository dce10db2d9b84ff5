"""The gateway's own CPU per request, read from the kernel, and its memory over many requests.

Run with ``python -m tests.bench.cpu`` (part of ``make bench``). It starts the stack as
``make run`` does (nginx in front of two replicas), then sends requests straight to one
replica with a user key whose limits are never reached (so every request takes the whole
Redis path: key lookup, admission, usage) and reads that replica's ``utime + stime`` from
``/proc/<pid>/stat`` before and after:

- CPU per non-streaming chat request (mock_chat, 16 tokens, a weightless model);
- CPU per streamed chunk (mock_chat, 256-token streams, less the cost of a one-token
  stream, so the per-request part is not counted twice);
- CPU per ``GET /health/live`` (no key, no Redis: the floor of any request);
- the replica's resident memory before and after 10,000 chat requests.

Beside each, measured in the same run, the floor it is compared with: the CPU this process
spends on the same Triton request with ``tritonclient.grpc.aio`` (what a program calling
Triton directly pays; read with ``getrusage``), and the CPU of a bare uvicorn ASGI app that
answers every request with a constant (what any HTTP request costs here).

The "before" column is a replica of older code measured in the same run: ``--baseline REF``
(default :data:`BASELINE`, the code before the current performance work) is checked out in a
temporary git worktree and served by one more replica, started with the first replica's own
environment (same Redis, Triton and settings) on another port; each figure is measured on
both replicas in turn, twice, and the mean of each is shown. ``--baseline none`` skips it.

The client runs in this process on the same 2 cores, so what matters is CPU time, not wall
time: the numbers hold however busy the machine is (within the noise of a shared host).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import tritonclient.grpc.aio as triton_grpc

from gateway.stack.triton_server import free_port
from tests.bench import write_table
from tests.bench.chat import direct_call
from tests.support.stack import GatewayProcess

TICK = os.sysconf("SC_CLK_TCK")
# mock_chat answers as many words as the directive says (max_tokens caps them).
MESSAGES = [{"role": "user", "content": "[mock:words=100000] Tell me about the quick brown fox."}]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def load(call: Callable[[], Awaitable[int]], concurrency: int, total: int) -> int:
    """Runs ``total`` calls, ``concurrency`` at a time; returns the sum of what they return."""
    remaining, counted = total, 0

    async def worker() -> None:
        nonlocal remaining, counted
        while remaining > 0:
            remaining -= 1
            got = await call()  # awaited first: `counted += await ...` would lose updates
            counted += got

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counted


async def measure(
    pid: int, call: Callable[[], Awaitable[int]], concurrency: int, total: int
) -> tuple[float, int]:
    """CPU seconds the replica spent on ``total`` calls, and what the calls counted."""
    before = cpu_seconds(pid)
    counted = await load(call, concurrency, total)
    return cpu_seconds(pid) - before, counted


#: The code before issue 27 (the second performance pass): the "before" replica's.
BASELINE = "39fba93"


@contextmanager
def baseline_replica(stack: GatewayProcess, ref: str) -> Iterator[tuple[int, str]]:
    """A replica of the code at ``ref`` beside the stack's (its pid and host:port)."""
    address = stack.replica_addresses()[0]
    environ = Path(f"/proc/{stack.replica_pid(address)}/environ").read_bytes()
    env = dict(item.split("=", 1) for item in environ.decode().split("\0") if "=" in item)
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder, "baseline")
        subprocess.run(
            ["git", "-C", str(root), "worktree", "add", "--detach", "--quiet", str(tree), ref],
            check=True,
        )
        # Only the settings the older code has (it refuses the others by name).
        known = (tree / "gateway" / "config.py").read_text()
        env = {
            name: value
            for name, value in env.items()
            if not name.startswith("GATEWAY_")
            or f"    {name.removeprefix('GATEWAY_').lower()}:" in known
        }
        port = free_port()
        serve = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port"]
        try:
            with running(
                [*serve, str(port)], cwd=tree, env={**env, "PYTHONPATH": str(tree)}
            ) as pid:
                yield pid, f"127.0.0.1:{port}"
        finally:
            subprocess.run(
                ["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                check=False,
            )


BARE_APP = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"status":"ok"}'})
"""


async def direct_floors(triton: str, scale: float) -> tuple[float, float]:
    """This process's CPU per direct non-streaming request and per directly streamed chunk
    (``tritonclient.grpc.aio``, the gateway's tensors, the same request counts)."""
    client = triton_grpc.InferenceServerClient(triton)

    def call(stream: bool, tokens: int) -> Callable[[], Awaitable[int]]:
        async def one() -> int:
            sample = await direct_call(client, stream, tokens)
            return sample.chunks if stream else 1

        return one

    await load(call(False, 16), 8, 200)
    before = own_cpu_seconds()
    count = await load(call(False, 16), 8, int(2000 * scale))
    per_request = (own_cpu_seconds() - before) / count
    streams = int(60 * scale)
    before = own_cpu_seconds()
    long_chunks = await load(call(True, 256), 4, streams)
    middle = own_cpu_seconds()
    short_chunks = await load(call(True, 1), 4, streams)
    after = own_cpu_seconds()
    per_chunk = ((middle - before) - (after - middle)) / (long_chunks - short_chunks)
    await client.close()
    return per_request, per_chunk


@contextmanager
def bare_uvicorn() -> Iterator[tuple[int, str]]:
    """A bare uvicorn ASGI app (httptools, uvloop) answering a constant: its pid and URL."""
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "bare_app.py").write_text(BARE_APP)
        port = free_port()
        with running(
            [sys.executable, "-m", "uvicorn", "--app-dir", folder, "bare_app:app",
             "--port", str(port), "--log-level", "warning"],
        ) as pid:  # fmt: skip
            yield pid, f"http://127.0.0.1:{port}"


@contextmanager
def running(command: list[str], **popen: Any) -> Iterator[int]:
    """``command`` running (its pid), terminated at the end."""
    process = subprocess.Popen(command, **popen)
    try:
        yield process.pid
    finally:
        process.terminate()
        process.wait()


async def bare_floor(bare_app: tuple[int, str], scale: float) -> float:
    """CPU per request of the bare app."""
    pid, url = bare_app
    async with httpx.AsyncClient(base_url=url) as http:
        for _ in range(100):
            try:
                await http.get("/")
                break
            except httpx.TransportError:
                await asyncio.sleep(0.1)

        async def call() -> int:
            assert (await http.get("/health/live")).status_code == 200
            return 1

        await load(call, 8, 300)
        seconds, count = await measure(pid, call, 8, int(3000 * scale))
        return seconds / count


class Replica:
    """The calls the benchmark makes to one replica, and its CPU on them."""

    def __init__(self, pid: int, address: str, headers: dict[str, str]) -> None:
        self.pid = pid
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        self.http = httpx.AsyncClient(
            base_url=f"http://{address}", timeout=60, limits=limits, headers=headers
        )

    async def ready(self) -> None:
        for _ in range(600):
            try:
                if (await self.http.get("/health/ready")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError("the replica did not get ready")

    async def chat(self) -> int:
        body = {"model": "mock_chat", "messages": MESSAGES, "max_tokens": 16}
        response = await self.http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return 1

    def stream(self, tokens: int) -> Callable[[], Awaitable[int]]:
        async def call() -> int:
            body = {"model": "mock_chat", "messages": MESSAGES, "max_tokens": tokens}
            chunks = 0
            async with self.http.stream(
                "POST", "/v1/chat/completions", json={**body, "stream": True}
            ) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    chunks += line.startswith("data: {") and '"content":"' in line
            return chunks

        return call

    async def health(self) -> int:
        response = await self.http.get("/health/live")
        assert response.status_code == 200
        return 1

    async def warm(self) -> None:
        await load(self.chat, 8, 200)  # connections, caches, imports
        await load(self.stream(256), 4, 8)

    async def per_chat(self, scale: float) -> float:
        seconds, count = await measure(self.pid, self.chat, 8, int(2000 * scale))
        return seconds / count

    async def per_chunk(self, scale: float) -> float:
        streams = int(60 * scale)
        long_s, long_chunks = await measure(self.pid, self.stream(256), 4, streams)
        short_s, short_chunks = await measure(self.pid, self.stream(1), 4, streams)
        return (long_s - short_s) / (long_chunks - short_chunks)

    async def per_health(self, scale: float) -> float:
        seconds, count = await measure(self.pid, self.health, 8, int(3000 * scale))
        return seconds / count


async def both(
    figure: Callable[[Replica], Awaitable[float]], now: Replica, before: Replica | None
) -> tuple[float, float | None]:
    """``figure`` of each replica, measured in turn twice (means)."""
    mine, theirs = [], []
    for _ in range(2):
        if before is not None:
            theirs.append(await figure(before))
        mine.append(await figure(now))
    return sum(mine) / len(mine), (sum(theirs) / len(theirs) if theirs else None)


def shown(value: float | None, unit: float, fmt: str) -> str:
    return "-" if value is None else format(value * unit, fmt)


async def run(
    stack: GatewayProcess,
    bare_app: tuple[int, str],
    scale: float,
    baseline: tuple[int, str] | None,
) -> list[str]:
    address = stack.replica_addresses()[0]
    headers = stack.user_headers()
    now = Replica(stack.replica_pid(address), address, headers)
    before = Replica(baseline[0], baseline[1], headers) if baseline else None
    direct_request, direct_chunk = await direct_floors(stack.triton_grpc, scale)
    bare = await bare_floor(bare_app, scale)
    for replica in (now, before):
        if replica is not None:
            await replica.ready()
            await replica.warm()
    rows = []
    measures = [
        ("CPU per non-streaming chat request (user key)", Replica.per_chat, 1000, ".2f",
         "ms", direct_request, "a direct tritonclient call", "<= 1.0 ms"),
        ("CPU per streamed chunk", Replica.per_chunk, 1e6, ".0f", "µs", direct_chunk,
         "a chunk read directly", "<= 50 µs"),
        ("CPU per GET /health/live", Replica.per_health, 1000, ".2f", "ms", bare,
         "a bare uvicorn app", "<= 0.2 ms"),
    ]  # fmt: skip
    for label, figure, unit, fmt, name, floor, against, goal in measures:
        mine, theirs = await both(lambda r, f=figure: f(r, scale), now, before)  # type: ignore[misc]
        rows.append(
            f"| {label} | {shown(theirs, unit, fmt)} {name} | **{mine * unit:{fmt}} {name}** | "
            f"{mine / floor:.2f}x {against} ({floor * unit:{fmt}} {name}) | {goal} |"
        )
        print(rows[-1], flush=True)
    start_rss = rss_mb(now.pid)
    await load(now.chat, 8, int(10_000 * scale))
    rows.append(
        f"| replica RSS before / after {int(10_000 * scale):,} chat requests | - | "
        f"**{start_rss:.0f} / {rss_mb(now.pid):.0f} MB** | - | flat |"
    )
    print(rows[-1], flush=True)
    for replica in (now, before):
        if replica is not None:
            await replica.http.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        help="git ref of the code measured beside this one ('none': skip it)",
    )
    args = parser.parse_args()
    ref = None if args.baseline == "none" else args.baseline
    header = [
        f"| measure (one replica of `make run`) | before ({ref or 'not run'}) | now "
        "| against the floor, same run | goal |",
        "| --- | --- | --- | --- | --- |",
    ]
    print(*header, sep="\n", flush=True)
    stack = GatewayProcess(models=["mock_chat"]).start()
    try:
        stack.wait_ready()
        with ExitStack() as running:
            bare_app = running.enter_context(bare_uvicorn())
            baseline = running.enter_context(baseline_replica(stack, ref)) if ref else None
            rows = asyncio.run(run(stack, bare_app, args.scale, baseline))
    finally:
        stack.stop()
    write_table(args.out, header + rows)


if __name__ == "__main__":
    main()
