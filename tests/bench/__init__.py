"""Benchmarks: each starts the real stack and prints a table (``make bench``)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from tests.support.stack import GatewayProcess


def keyed_client(stack: GatewayProcess, key: str) -> httpx.AsyncClient:
    """An httpx client of ``stack`` sending ``key``, with room for many connections (a
    benchmark's many users share it)."""
    import httpx

    return httpx.AsyncClient(
        base_url=stack.base_url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
        limits=httpx.Limits(max_connections=256, max_keepalive_connections=256),
    )


def write_table(path: str | None, lines: list[str]) -> None:
    """Writes a benchmark's table to ``path`` (its ``--out``), if one was given."""
    if path:
        Path(path).write_text("\n".join(lines) + "\n")


def options(doc: str | None) -> argparse.Namespace:
    """A benchmark's options: ``--scale`` (multiplies request counts) and ``--out``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--out", help="also write the table to this file")
    return parser.parse_args()


def table_on_stack(
    doc: str | None,
    header: list[str],
    models: Sequence[str],
    rows: Callable[[GatewayProcess, float], Coroutine[Any, Any, list[str]]],
) -> None:
    """A benchmark's ``main``: its options (:func:`options`), its ``header`` printed, the
    rows ``rows`` measures on a stack of ``models`` (:func:`rows_on_stack`) printed, and
    the table written to ``--out``."""
    args = options(doc)
    print(*header, sep="\n", flush=True)
    found = rows_on_stack(models, rows, args.scale)
    print(*found, sep="\n", flush=True)
    write_table(args.out, header + found)


def rows_on_stack(
    models: Sequence[str],
    rows: Callable[[GatewayProcess, float], Coroutine[Any, Any, list[str]]],
    scale: float,
) -> list[str]:
    """The table rows ``rows`` measures on a stack it starts (one replica, no nginx) with
    ``models``, stopped afterwards."""
    from tests.support.stack import GatewayProcess

    stack = GatewayProcess(models=list(models), nginx=False).start()
    try:
        stack.wait_ready()
        return asyncio.run(rows(stack, scale))
    finally:
        stack.stop()
