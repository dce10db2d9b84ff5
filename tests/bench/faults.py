"""Faults benchmark: what a client loses when Redis, a gateway replica and Triton are each
killed once under load (issue 28's soak).

Run with ``make bench`` (or ``python -m tests.bench.faults``; ``--scale 0.25`` for a
quarter of the requests). It starts ``gateway up`` as ``make run`` does (nginx in front of
two replicas, Redis, Triton with its default models, whose loading makes a restart last
about 10 s here, the supervisor with its default intervals) and sends
12,000 chat requests at concurrency 32 through nginx with a user key (limits on: every
request takes the Redis path), half of them streamed, from the official ``openai`` SDK
with its own retries as users run it (two, honouring ``Retry-After``). A quarter of the way
in it kills Redis (SIGKILL), halfway a replica, three quarters of the way Triton, each
once, after the part killed before is back. A request is **lost** when it failed after
its retries and had not started streaming (no content reached the client); a stream
already running when its replica or Triton died is **cut** (it ends with an error event,
or a torn connection for a replica): no gateway could carry it on. Each request counts
under the fault before its end. ``--wait`` sets ``GATEWAY_BACKEND_WAIT_S`` (``0``: the
gateway does not wait for a backend coming back, the behaviour before issue 28 but for
``Retry-After``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

import httpx
import openai

from gateway.config import Settings
from tests.bench import write_table
from tests.support.stack import GatewayProcess

CONCURRENCY = 32
#: A short answer that takes a moment (8 words, 10 ms apart), so kills find requests in
#: flight.
CONTENT = "[mock:delay_ms=10] [mock:words=8] how are you"


def _pid(pattern: str) -> int:
    found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    pids = [int(pid) for pid in found.stdout.split()]
    assert len(pids) == 1, (pattern, pids)
    return pids[0]


@dataclass
class Window:
    """The requests that ended after one fault (or before the first)."""

    name: str
    began: float
    ended: int = 0
    lost: int = 0
    cut: int = 0
    retried: int = 0
    slowest_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)


class Soak:
    def __init__(self, stack: GatewayProcess, total: int) -> None:
        self.stack = stack
        self.total = total
        self.started = 0
        self.windows = [Window("none (before the first fault)", time.monotonic())]
        #: Set when the request that starts a quarter, a half, three quarters is sent.
        self.marks = {total * n // 4: asyncio.Event() for n in (1, 2, 3)}

    def _window(self, at: float) -> Window:
        return next(w for w in reversed(self.windows) if w.began <= at)

    async def _one(self, client: openai.AsyncOpenAI, i: int) -> None:
        stream = i % 2 == 1
        began = time.monotonic()
        pieces = 0
        error: str | None = None
        try:
            if stream:
                chunks = await client.chat.completions.create(
                    model="mock_chat",
                    messages=[{"role": "user", "content": CONTENT}],
                    max_tokens=8,
                    stream=True,
                )
                async for chunk in chunks:
                    if chunk.choices and chunk.choices[0].delta.content:
                        pieces += 1
            else:
                answer = await client.chat.completions.create(
                    model="mock_chat", messages=[{"role": "user", "content": CONTENT}], max_tokens=8
                )
                assert answer.choices[0].message.content
        except (openai.APIError, httpx.HTTPError) as exc:
            code = getattr(exc, "code", None) or getattr(exc, "status_code", None)
            error = f"{type(exc).__name__}({code})" if code else type(exc).__name__
        ended = time.monotonic()
        window = self._window(ended)
        window.ended += 1
        window.slowest_s = max(window.slowest_s, ended - began)
        if error is not None:
            if pieces:
                window.cut += 1
            else:
                window.lost += 1
            window.errors[error] = window.errors.get(error, 0) + 1

    async def _worker(self, client: openai.AsyncOpenAI) -> None:
        while self.started < self.total:
            i = self.started
            self.started += 1
            if i in self.marks:
                self.marks[i].set()
            await self._one(client, i)

    async def _wait_back(self, what: str, since: int, timeout_s: float = 120) -> None:
        """Until ``gateway up`` says the part is back (after its ``since``-th character)."""
        deadline = time.monotonic() + timeout_s
        while f"{what} is back" not in self.stack.output()[since:]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not back within {timeout_s} s")
            await asyncio.sleep(0.1)

    async def _faults(self) -> None:
        stack = self.stack
        replica = stack.replica_addresses()[0]
        faults = [
            ("Redis", lambda: _pid(f"redis-server 127.0.0.1:{stack.redis_port}"), "Redis"),
            ("a gateway replica", lambda: stack.replica_pid(replica), f"port {replica[-5:]}"),
            ("Triton", lambda: _pid(f"--grpc-port={stack.grpc_port}"), "Triton"),
        ]
        for mark, (name, pid, back) in zip(self.marks.values(), faults, strict=True):
            await mark.wait()
            log = len(stack.output())
            os.kill(pid(), signal.SIGKILL)
            self.windows.append(Window(name, time.monotonic()))
            print(f"killed {name} after {self.started} requests", flush=True)
            await self._wait_back(back, log)

    async def run(self) -> list[Window]:
        async def count(response: httpx.Response) -> None:
            if response.status_code >= 500 or response.status_code == 429:
                self._window(time.monotonic()).retried += 1

        key = self.stack.user_headers()["Authorization"].removeprefix("Bearer ")
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(
            limits=limits, timeout=120, event_hooks={"response": [count]}
        ) as http:
            client = openai.AsyncOpenAI(
                base_url=self.stack.base_url + "/v1", api_key=key, http_client=http, max_retries=2
            )
            faults = asyncio.create_task(self._faults())
            await asyncio.gather(*(self._worker(client) for _ in range(CONCURRENCY)))
            await faults
        return self.windows


def table(windows: list[Window], total: int, wall_s: float, wait: str) -> list[str]:
    rows = [
        f"{total:,} `mock_chat` requests (half streamed) at concurrency {CONCURRENCY} through "
        f"nginx, the openai SDK's retries (2, Retry-After), GATEWAY_BACKEND_WAIT_S={wait}: "
        f"{total / wall_s:,.0f} req/s over {wall_s:.0f} s",
        "",
        "| fault (SIGKILL) | requests ended after it | lost (failed before streaming) | "
        "streams cut | 5xx the SDK retried | slowest request | the client's errors |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for w in windows:
        errors = ", ".join(f"{k} x{v}" for k, v in sorted(w.errors.items()))
        rows.append(
            f"| {w.name} | {w.ended:,} | **{w.lost}** | {w.cut} | {w.retried} | "
            f"{w.slowest_s:.1f} s | {errors} |"
        )
    lost = sum(w.lost for w in windows)
    cut = sum(w.cut for w in windows)
    rows.append(f"| **total** | {sum(w.ended for w in windows):,} | **{lost}** | {cut} | | | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the request count")
    parser.add_argument("--wait", default=None, help="GATEWAY_BACKEND_WAIT_S (default: its own)")
    parser.add_argument(
        "--models",
        default=",".join(Settings.model_fields["models"].default),
        help="the models Triton loads (default: gateway up's; they make its restart last)",
    )
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    total = int(12_000 * args.scale)
    env = {"GATEWAY_BACKEND_WAIT_S": args.wait} if args.wait is not None else {}
    stack = GatewayProcess(models=args.models.split(","), env=env).start()
    try:
        stack.wait_ready()
        started = time.monotonic()
        windows = asyncio.run(Soak(stack, total).run())
        wall = time.monotonic() - started
    finally:
        stack.stop()
    rows = table(windows, total, wall, args.wait or "5 (default)")
    print("\n".join(rows))
    write_table(args.out, rows)


if __name__ == "__main__":
    main()
