"""A real ``redis-server`` on a free port, for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

from gateway.stack.redis_server import EmbeddedRedis
from tests.stack import free_port


def redis_server(directory: Path) -> EmbeddedRedis:
    """A started ``redis-server`` on a free port, keeping its data in ``directory``."""
    return EmbeddedRedis(directory, free_port()).start()
