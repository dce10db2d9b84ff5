"""Scaling benchmark, behind the scaling guide (docs/deployment.md): what a request costs a tier.

Run with ``make bench`` (or ``python -m tests.bench.scale``). It starts a 3-master Redis
Cluster (real ``redis-server`` processes) and ``gateway up`` on it with four gateway
replicas behind nginx and Triton serving the weightless ``mock_chat``, then sends
non-streaming 16-token chat requests with a user key (limits on, so every request takes the
whole Redis path) through nginx at concurrency 32. It reads, around those requests, the CPU
time of every process of each tier (``/proc/<pid>/stat``) and the commands each Redis node
ran (``INFO commandstats``), and prints the cost per request of each tier and what a given
load (``--target`` requests/s) needs of each. Everything shares one 2-core machine, so the
requests/s here are what 2 cores give all tiers together; the per-request costs are what
scale.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import subprocess
import tempfile
from pathlib import Path

import httpx
import redis

from tests.bench.cpu import MESSAGES, cpu_seconds, load, own_cpu_seconds
from tests.support.redis_server import Cluster
from tests.support.stack import GatewayProcess

#: Share of a core a tier is planned to use at the target load (headroom for bursts).
UTILIZATION = 0.7


def _pids(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(child) for child in found.stdout.split()]


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:  # gone meanwhile
            continue
    return total


def _redis_commands(cluster: Cluster) -> dict[str, int]:
    """Calls per command over every node, the benchmark's own INFO and CLUSTER left out."""
    counted: dict[str, int] = {}
    for port in cluster.ports:
        stats = redis.Redis(port=port).info("commandstats")
        for name, fields in stats.items():
            command = name.removeprefix("cmdstat_")
            if command not in ("info", "cluster", "ping", "command"):
                counted[command] = counted.get(command, 0) + int(fields["calls"])
    return counted


async def run(stack: GatewayProcess, cluster: Cluster, total: int, target: int) -> list[str]:
    headers = stack.user_headers()
    tiers = {
        "gateway replicas (4)": [stack.replica_pid(a) for a in stack.replica_addresses()],
        "nginx": [p for master in _pids("nginx: master") for p in [master, *_children(master)]],
        "Redis Cluster (3 masters)": [p.pid for p in cluster.processes.values()],
        "Triton + mock_chat": [
            p
            for server in _pids(f"--grpc-port={stack.grpc_port}")
            for p in [server, *_children(server)]
        ],
    }
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    body = {"model": "mock_chat", "messages": MESSAGES, "max_tokens": 16}
    async with httpx.AsyncClient(
        base_url=stack.base_url, headers=headers, timeout=60, limits=limits
    ) as http:

        async def call() -> int:
            response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            return 1

        await load(call, 32, 300)  # warm up
        before = {tier: _cpu(pids) for tier, pids in tiers.items()}
        commands_before = _redis_commands(cluster)
        client_before = own_cpu_seconds()
        started = asyncio.get_running_loop().time()
        count = await load(call, 32, total)
        wall = asyncio.get_running_loop().time() - started
        client = own_cpu_seconds() - client_before
        after = {tier: _cpu(pids) for tier, pids in tiers.items()}
        commands_after = _redis_commands(cluster)
    commands = {
        name: calls - commands_before.get(name, 0)
        for name, calls in commands_after.items()
        if calls > commands_before.get(name, 0)
    }
    per_request = {tier: (after[tier] - before[tier]) / count * 1000 for tier in tiers}
    rows = [
        f"{count} requests at concurrency 32 through nginx: **{count / wall:,.0f} req/s** on 2 "
        f"cores for every tier together (the client took {client / count * 1000:.2f} ms "
        "CPU per request of them)",
        "",
        f"| tier | CPU per request | cores for {target:,} req/s at {UTILIZATION:.0%} | "
        "what limits it |",
        "| --- | --- | --- | --- |",
    ]
    limits_of = {
        "gateway replicas (4)": "CPU: add replicas (HPA on CPU)",
        "nginx": "CPU: nginx workers (one per core)",
        "Redis Cluster (3 masters)": "one core per master (Redis runs commands on one thread): "
        "add masters",
        "Triton + mock_chat": "the model: real models cost far more (see the other benchmarks)",
    }
    for tier, ms in per_request.items():
        cores = target * ms / 1000 / UTILIZATION
        rows.append(f"| {tier} | {ms:.2f} ms | {cores:,.1f} | {limits_of[tier]} |")
    ops = sum(commands.values()) / count
    ranked = sorted(commands.items(), key=lambda c: -c[1])
    detail = ", ".join(
        f"{name} {calls / count:.2f}" for name, calls in ranked if calls >= count / 100
    )
    trips = (commands.get("evalsha", 0) + commands.get("eval", 0)) / count
    redis_ms = per_request["Redis Cluster (3 masters)"]
    masters = math.ceil(target * redis_ms / 1000 / UTILIZATION)
    replicas = math.ceil(target * per_request["gateway replicas (4)"] / 1000 / UTILIZATION)
    rows += [
        "",
        f"Redis round trips per request: **{trips:.2f}** (Lua scripts); Redis commands per "
        f"request, those the scripts run included: **{ops:.2f}** ({detail}); at {target:,} "
        "req/s that is "
        f"{target * ops:,.0f} commands/s, about {masters} Redis master(s) at "
        f"{UTILIZATION:.0%} of a core each.",
        f"Gateway replicas of one core each for {target:,} req/s: about **{replicas}**.",
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--target", type=int, default=10_000, help="requests/s to size for")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cluster = Cluster(Path(folder))
        stack = GatewayProcess(
            models=["mock_chat"], redis_url=cluster.url, env={"GATEWAY_REPLICAS": "4"}
        ).start()
        try:
            stack.wait_ready()
            rows = asyncio.run(run(stack, cluster, int(3000 * args.scale), args.target))
        finally:
            stack.stop()
            cluster.stop()
    print("\n".join(rows))


if __name__ == "__main__":
    main()
