"""The Redis connection every replica shares, and the one place that turns "Redis is down"
into a clean 503.

Keys, sessions, rate-limit counters, usage, budgets and the audit log live in Redis so that
any number of gateway processes behave as one. When Redis cannot be reached, a request that
needs it first waits (within ``GATEWAY_BACKEND_WAIT_S``, :mod:`gateway.outages`) if this
process reached Redis a moment ago (a restart, a Sentinel failover), then fails with
:class:`StoreUnavailableError`, whose ``Retry-After`` says when Redis is likely back; a
Redis gone for long, never reached, or a Cluster's node fails at once (or after
``redis_timeout_s`` per try when unanswered). Nothing is let through unchecked. The
client's pool reconnects on the next command, so the gateway recovers by itself when
Redis returns. A Redis that refuses a write because it is full (``maxmemory`` with the
``noeviction`` policy) gives :class:`StoreFullError`, also a 503. Stored conversations
(responses, sessions, spoken answers' transcripts) may only fill it to
:data:`STORED_SHARE` of ``maxmemory`` (:class:`Headroom`): the rest stays free for what every
request writes (rate-limit windows, usage, key changes), so a key that stores a lot cannot
stop every other key's requests.

A Redis URL may carry a password: messages show it as :func:`redacted`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast
from urllib.parse import unquote, urlsplit, urlunsplit

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import NoBackoff
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    MaxConnectionsError,
    OutOfMemoryError,
    RedisClusterException,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway import outages
from gateway.errors import StoreFullError, StoreUnavailableError
from gateway.outages import Attempt, Outage

#: Every key the gateway writes starts with this, so it can share a Redis with other apps.
PREFIX = "gw:"

P = ParamSpec("P")
T = TypeVar("T")


SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"


def redacted(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``, for messages and logs."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    user, _, hosts = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{hosts}"))


class _Waiting(ConnectionPool):
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


class _WaitingSentinelPool(_Waiting, SentinelConnectionPool):
    """The Sentinel's pool (it follows the master), waiting for a busy connection."""


#: How long a Redis restart is taken to last until one was seen to end (``gateway up``
#: starts a Redis that died again within about a second, its data read back from the
#: append-only file).
REDIS_RESTART_S = 2.0


class _ComingBack:
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


class _SentinelComingBack(_ComingBack):
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


def _coming_back(connection_class: type, mixin: type = _ComingBack) -> type:
    """``connection_class`` (plain, TLS, Unix socket, Sentinel's) waiting for a Redis coming
    back."""
    return type(f"ComingBack{connection_class.__name__}", (mixin, connection_class), {})


def connect(
    url: str, timeout_s: float, max_connections: int, outage: Outage | None = None
) -> Redis:
    """A client with short timeouts and one immediate retry: the retry replaces a pooled
    connection that died with a restarted Redis; a Redis that is really down fails at once.

    At most ``max_connections`` connections are open at once; a command that finds them all
    busy waits up to ``timeout_s`` for one, then fails like a Redis that does not answer
    (redis-py's own pool would refuse it at once: from redis-py 8 it holds 100 by default).
    With ``outage`` (what this process knows of Redis's outages), a connection to a Redis
    coming back waits for it (see :class:`_ComingBack`); not with a Cluster.
    A Cluster's client keeps that many per node and refuses past it (redis-py's Cluster
    client has no waiting pool).

    ``redis+sentinel://[:password@]host:port[,host:port...]/service_name[/db]`` asks those
    Sentinels (with the password, if they ask for one) for the master of ``service_name``
    (with the same password) and follows it through a failover: while
    there is no master (the old one is gone, no new one is elected yet) a request waits
    for the new one up to ``GATEWAY_BACKEND_WAIT_S`` (with ``outage``), then fails with 503
    like a Redis that is down; none is let through unchecked.

    ``redis+cluster://[:password@]host:port[,host:port...]`` is a Redis Cluster (redis-py's
    ``RedisCluster``, which finds every node from these): every key of one API key shares
    a hash tag, so each Lua script runs in one slot. It is returned as a ``Redis``: it
    answers the same commands, and the gateway sends no cross-slot one.
    """
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_connect_timeout": timeout_s,
        "socket_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 1),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }
    scheme = urlsplit(url).scheme
    if scheme == CLUSTER_SCHEME:
        return _cluster(url, timeout_s, max_connections)
    if scheme != SENTINEL_SCHEME:
        pool = _Waiting.from_url(url, max_connections=max_connections, wait_s=timeout_s, **options)
        if outage is not None:
            pool.connection_class = _coming_back(pool.connection_class)
            pool.connection_kwargs["outage"] = outage
        return Redis.from_pool(pool)
    nodes, service, db, password = parse_sentinel_url(url)
    waiting: dict[str, Any] = {}
    if outage is not None:
        managed = _coming_back(SentinelManagedConnection, _SentinelComingBack)
        waiting = {"connection_class": managed, "outage": outage}
    # The URL's password opens the Sentinels too: a Sentinel anyone may command can name
    # any master (SENTINEL REMOVE/MONITOR). One without requirepass accepts it all the same.
    # The masters' retry policy: redis-py's own backs off for seconds on a Sentinel that
    # is down or refuses the password, before it asks the next one.
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        nodes,
        sentinel_kwargs={
            "socket_connect_timeout": timeout_s,
            "socket_timeout": timeout_s,
            "password": password,
            "retry": options["retry"],
        },
    )
    master: Redis = sentinels.master_for(
        service,
        connection_pool_class=_WaitingSentinelPool,
        db=db,
        password=password,
        max_connections=max_connections,
        wait_s=timeout_s,
        **options,
        **waiting,
    )
    return master


def _cluster(url: str, timeout_s: float, max_connections: int) -> Redis:
    nodes, password = _nodes(url)
    if urlsplit(url).path.strip("/"):
        raise ValueError(f"{redacted(url)!r}: a Redis Cluster has one database; give no path")
    cluster = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        password=password,
        decode_responses=True,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        max_connections=max_connections,
    )
    return cast(Redis, cluster)


def is_cluster(redis: Redis) -> bool:
    return isinstance(redis, RedisCluster)


def _nodes(url: str) -> tuple[list[tuple[str, int]], str | None]:
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    password = unquote(parts.password) if parts.password else None
    nodes = []
    for node in hosts.split(","):
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{redacted(url)!r}: each node must be host:port, got {node!r}")
        nodes.append((host.strip("[]"), int(port)))
    return nodes, password


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int, str | None]:
    """``redis+sentinel://[:password@]h1:p1,h2:p2/service[/db]`` -> the Sentinels'
    addresses, the service (master) name, the database and the password (the masters'
    and the Sentinels')."""
    nodes, password = _nodes(url)
    path = [p for p in urlsplit(url).path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"{redacted(url)!r}: the path must be /service_name or /service_name/db")
    return nodes, path[0], int(path[1]) if len(path) == 2 else 0, password


def needs_store(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Marks a coroutine that talks to Redis: connection failures and timeouts become
    :class:`StoreUnavailableError`, a write refused for want of memory
    :class:`StoreFullError` (both 503; what Redis said is only logged). Other Redis errors
    are bugs and stay 500s."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except OutOfMemoryError as exc:
            raise StoreFullError(f"Redis: {exc}") from exc
        except (
            RedisConnectionError,
            RedisTimeoutError,
            ClusterDownError,
            RedisClusterException,
        ) as exc:
            error = StoreUnavailableError(f"Redis: {type(exc).__name__}: {exc}")
            retry_after = getattr(exc, "retry_after_s", None)  # see _ComingBack
            if retry_after is not None:
                error.headers["Retry-After"] = str(retry_after)
            raise error from exc

    return wrapper


@needs_store
async def ping(redis: Redis) -> bool:
    return bool(await redis.ping())


#: The layout of the keys in Redis. 2: everything of one API key carries the key id as a
#: Redis Cluster hash tag (``gw:key:{id}``, ``gw:rl:{id}:requests``, ``gw:usage:{id}``).
LAYOUT = "2"
_LAYOUT_KEY = f"{PREFIX}layout"
_LAYOUT_1 = re.compile(r"^gw:(key|usage|rl):([^{}:]+)(:.*)?$")


@needs_store
async def migrate(redis: Redis) -> int:
    """Renames the data of an API key written before layout 2 (``gw:key:<id>`` and the
    like) to layout 2, keeping expiries; returns how many keys it renamed. Safe to run from
    several replicas at once; once done, it costs one ``GET``."""
    if await redis.get(_LAYOUT_KEY) == LAYOUT:
        return 0
    renamed = 0
    for kind in ("key", "usage", "rl"):
        async for name in redis.scan_iter(match=f"{PREFIX}{kind}:[^{{]*", count=1000):
            found = _LAYOUT_1.match(name)
            if found is None:
                continue
            _, key_id, rest = found.groups()
            try:
                renamed += int(
                    await redis.renamenx(name, f"{PREFIX}{kind}:{{{key_id}}}{rest or ''}")
                )
            except ResponseError:  # another replica renamed it meanwhile
                continue
    await redis.set(_LAYOUT_KEY, LAYOUT)
    return renamed


#: The share of Redis's ``maxmemory`` stored conversations may fill (see the module
#: docstring).
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
