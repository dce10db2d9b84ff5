"""The connections behind :func:`gateway.state.redis.connect`: redis-py's pool and
connection classes, extended where redis-py has no setting for what the gateway needs.

- :class:`WaitingPool`: a command that finds every connection busy waits for one.
- :class:`ComingBack` (and :class:`SentinelComingBack`): a connection to a Redis that went
  away a moment ago (a restart, a Sentinel failover) waits for it to come back, within
  the request's wait allowance (:mod:`gateway.outages`).

They override redis-py's own methods (``get_connection``, ``release``,
``connect_check_health``, Sentinel's ``_connect_retry``): a redis-py upgrade is checked
against ``tests/unit/test_outages.py`` and ``tests/unit/test_sentinel.py``.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import ConnectionPool
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import BusyLoadingError, MaxConnectionsError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.outages import Attempt, Outage


class WaitingPool(ConnectionPool):
    """redis-py's pool, but a command that finds every connection busy waits for one (up to
    ``wait_s``) instead of failing at once. redis-py's ``BlockingConnectionPool`` waits too,
    but takes a lock and a timeout on every command: about 20 µs more each (measured here:
    85 against 105 µs per GET); this one costs nothing until the pool is full."""

    def __init__(self, *args: Any, wait_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wait_s = wait_s
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + self._wait_s
        woken = False
        while True:
            try:
                return await super().get_connection()  # type: ignore[no-untyped-call]
            except MaxConnectionsError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                freed = asyncio.get_running_loop().create_future()
                # One woken but beaten to the connection keeps its place at the front.
                (self._waiters.appendleft if woken else self._waiters.append)(freed)
                try:
                    # Not wait_for: on 3.11 it can swallow a cancellation that comes as the
                    # future completes.
                    async with asyncio.timeout(left):
                        await freed
                    woken = True
                except TimeoutError:
                    pass
                except BaseException:
                    if freed.done() and not freed.cancelled():
                        self._wake()  # woken, but it will not take the connection
                    raise
                finally:
                    if freed in self._waiters:
                        self._waiters.remove(freed)

    async def release(self, connection: Any) -> None:
        try:
            await super().release(connection)
        finally:
            self._wake()

    def _wake(self) -> None:
        """Wakes the longest waiting command, if any."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class WaitingSentinelPool(WaitingPool, SentinelConnectionPool):
    """The Sentinel's pool (it follows the master), waiting for a busy connection."""


class ComingBack:
    """A connection that waits to connect while Redis is coming back (it answered this
    process before, and went away a moment ago: a restart, a Sentinel failover with no
    master yet), within the request's wait allowance (:mod:`gateway.outages`). Only the
    connection waits: a command is sent once it is made, so none runs twice. Given up, the
    error carries the ``Retry-After`` :func:`needs_store` gives the 503."""

    _outage: Outage | None = None
    _waiting_now = False

    def __init__(self, *args: Any, outage: Outage | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outage = outage

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        # Every connection is made here (redis-py 8: by connect() and before a command).
        parent = super()
        await self._waiting(lambda: parent.connect_check_health(*args, **kwargs))  # type: ignore[attr-defined]

    async def _waiting(self, attempt: Callable[[], Awaitable[None]]) -> None:
        outage = self._outage
        if outage is None or self._waiting_now or self.is_connected:  # type: ignore[attr-defined]
            await attempt()
            return
        self._waiting_now = True  # one wait: Sentinel's connect makes a connection inside
        try:
            tries = Attempt(outage)
            while True:
                try:
                    await attempt()
                    await self._serving()
                except (RedisConnectionError, RedisTimeoutError) as exc:
                    if await tries.failed():
                        continue
                    exc.retry_after_s = outage.retry_after()  # type: ignore[union-attr]
                    raise
                tries.reached()
                return
        finally:
            self._waiting_now = False

    async def _serving(self) -> None:
        """Raises ``BusyLoadingError`` (a ``ConnectionError``) while a Redis just started
        reads its data back: it takes connections then (and AUTH), and refuses commands
        with ``LOADING``. One PING per new connection, so a command is sent once, on a
        Redis that serves it."""
        try:
            await self.send_command("PING", check_health=False)  # type: ignore[attr-defined]
            await self.read_response()  # type: ignore[attr-defined]
        except BusyLoadingError:
            await self.disconnect()  # type: ignore[attr-defined]
            raise


class SentinelComingBack(ComingBack):
    """Sentinel's connection: it asks the Sentinels for the master first (none during a
    failover: ``MasterNotFoundError``), which waits too. redis-py 8 reconnects a dropped
    connection before a command with ``connect_check_health``, which would try the old
    master's address again and again: here that goes through the Sentinels too."""

    async def _connect_retry(self) -> None:
        parent = super()
        await self._waiting(lambda: parent._connect_retry())  # type: ignore[attr-defined]

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if self._waiting_now or self._outage is None:  # called by _connect_retry itself
            await super().connect_check_health(*args, **kwargs)
        else:
            await self.connect()  # type: ignore[attr-defined]


def coming_back(connection_class: type, mixin: type = ComingBack) -> type:
    """``connection_class`` (plain, TLS, Unix socket, Sentinel's) waiting for a Redis coming
    back."""
    return type(f"ComingBack{connection_class.__name__}", (mixin, connection_class), {})
