"""Edge benchmark: through nginx (two gateway replicas) against straight to one gateway
process, measured in the same run on the weightless ``mock_chat`` model.

Run with ``make bench`` (or ``python -m tests.bench.edge``). It starts ``gateway up`` (nginx
in front of two replicas) on free ports and sends the same requests, in alternating rounds,
to nginx and to one of the replicas directly: non-streaming 16-token completions for
throughput and p50/p99 latency, and 64-token streams for time to first token. Client,
nginx, both replicas and Triton share one 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio

import httpx

from tests.bench import write_table
from tests.bench.chat import gateway_call, paired, pct, spread
from tests.support.stack import GatewayProcess


async def edge_benchmarks(stack: GatewayProcess, scale: float) -> list[str]:
    rows = []
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    replica = "http://" + stack.replica_addresses()[0]
    headers = stack.user_headers()

    def client(base_url: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits, headers=headers)

    async with client(replica) as direct, client(stack.base_url) as edge:
        for concurrency in (1, 32):
            n = int((600 if concurrency == 1 else 1920) * scale)
            for http in (direct, edge):  # warm connections on both paths
                await paired(
                    lambda h=http: gateway_call(h, False, 16),
                    lambda h=http: gateway_call(h, False, 16),
                    concurrency,
                    max(50, concurrency * 4),
                    rounds=1,
                )
            one, one_wall, through, through_wall = await paired(
                lambda: gateway_call(direct, False, 16),
                lambda: gateway_call(edge, False, 16),
                concurrency,
                n,
            )
            d = [s.latency * 1000 for s in one]
            e = [s.latency * 1000 for s in through]
            d_rps, e_rps = len(one) / one_wall, len(through) / through_wall
            rows.append(
                f"| non-streaming, 16 tokens | {concurrency} | {d_rps:,.0f} req/s, "
                f"{spread(d)} | {e_rps:,.0f} req/s, {spread(e)} | "
                f"throughput **{e_rps / d_rps:.2f}**, p99 {pct(e, 99) - pct(d, 99):+.2f} ms |"
            )
            n_stream = int((120 if concurrency == 1 else 384) * scale)
            one, _, through, _ = await paired(
                lambda: gateway_call(direct, True, 64),
                lambda: gateway_call(edge, True, 64),
                concurrency,
                n_stream,
            )
            d = [s.ttft * 1000 for s in one]
            e = [s.ttft * 1000 for s in through]
            rows.append(
                f"| time to first token, 64-token stream | {concurrency} | "
                f"{spread(d)} | {spread(e)} | "
                f"p99 {pct(e, 99) - pct(d, 99):+.2f} ms |"
            )
            print(*rows[-2:], sep="\n", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    stack = GatewayProcess(models=["mock_chat"]).start()
    header = [
        "| measure | concurrency | straight to one gateway process | through nginx "
        "(2 replicas) | nginx vs one process |",
        "| --- | --- | --- | --- | --- |",
    ]
    try:
        stack.wait_ready()
        print(*header, sep="\n", flush=True)
        rows = asyncio.run(edge_benchmarks(stack, args.scale))
    finally:
        stack.stop()
    write_table(args.out, header + rows)


if __name__ == "__main__":
    main()
