"""Whether this process reaches Redis: the background ``PING`` behind the
``gateway_redis_up`` gauge, and the readiness probe's check.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from redis.asyncio import Redis

from gateway import outages
from gateway.state.redis import ping


class RedisHealth:
    """Whether this process reaches Redis, from its own checks: a ``PING`` every
    ``interval_s`` in the background (from :meth:`start`) and each readiness probe's
    (:meth:`check`). Each result goes to ``report`` (the ``gateway_redis_up`` gauge), so
    Prometheus sees Redis down within an interval, traffic or none."""

    def __init__(self, redis: Redis, report: Callable[[bool], None], interval_s: float) -> None:
        self.redis = redis
        self.report = report
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> None:
        """Pings Redis and reports the result: :class:`StoreUnavailableError` (503) when it
        does not answer."""
        try:
            await ping(self.redis)
        except Exception:
            self.report(False)
            raise
        self.report(True)

    def start(self) -> None:
        """Starts the background checks (the first at once); :meth:`close` stops them."""
        if self._task is None:
            self._task = asyncio.create_task(self._keep_checking())

    async def _keep_checking(self) -> None:
        task = asyncio.current_task()
        # Like the readiness probe, the check reports what it finds now: it never waits for
        # a Redis coming back (nor is it counted among the requests that did).
        outages.begin(0.0)
        while True:
            # Down is reported; any failure is one (a Redis that refuses the password too).
            with contextlib.suppress(Exception):
                await self.check()
            if task is not None and task.cancelling():
                # A cancel that reached the client while it was connecting can come out as
                # a connection error (Python 3.11's timeouts): stop all the same, or close()
                # would wait for this loop forever.
                return
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
