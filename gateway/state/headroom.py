"""Room kept free in Redis: stored conversations (responses, sessions, spoken answers'
transcripts) may only fill Redis to :data:`STORED_SHARE` of its ``maxmemory``
(:class:`Headroom`); the rest stays free for what every request writes (rate-limit windows,
usage, key changes), so a key that stores a lot cannot stop every other key's requests.
Each key's and project's own share is :mod:`gateway.state.stored_bytes`.
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from gateway.errors import StoreFullError
from gateway.state.redis import needs_store

#: The share of Redis's ``maxmemory`` stored conversations may fill.
STORED_SHARE = 0.8


class Headroom:
    """Refuses to store conversations (503 ``store_full``) once Redis's memory is over
    ``share`` of its ``maxmemory`` (no ``maxmemory``: never). Redis's memory is read at most
    every ``every_s`` per process, so storing costs no extra round trip on most requests."""

    def __init__(self, redis: Redis, share: float | None = None, every_s: float = 1.0) -> None:
        self.redis = redis
        self.share = STORED_SHARE if share is None else share
        self.every_s = every_s
        self._next = 0.0
        self._over = False

    @needs_store
    async def check(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.every_s
            info: dict[str, Any] = await self.redis.info("memory")
            # A Cluster answers per node ({node: info}); a server, with its own info.
            nodes = [v for v in info.values() if isinstance(v, dict)] or [info]
            self._over = any(
                int(node.get("maxmemory", 0))
                and int(node.get("used_memory", 0)) > self.share * int(node["maxmemory"])
                for node in nodes
            )
        if self._over:
            raise StoreFullError(
                f"Redis is over {self.share:.0%} of its maxmemory: stored conversations may "
                "not take the rest, which keys, limits and usage need."
            )
