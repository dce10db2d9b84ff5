"""Benchmarks: each starts the real stack and prints a table (``make bench``)."""

from __future__ import annotations

from pathlib import Path


def write_table(path: str | None, lines: list[str]) -> None:
    """Writes a benchmark's table to ``path`` (its ``--out``), if one was given."""
    if path:
        Path(path).write_text("\n".join(lines) + "\n")
