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
``noeviction`` policy) gives :class:`StoreFullError`, also a 503 (:func:`needs_store`).

The pool and connection classes :func:`connect` uses are :mod:`gateway.state.connections`;
the room kept free for what every request writes is :mod:`gateway.state.headroom`; the key
layout's migration :mod:`gateway.state.migration`; the background check behind
``gateway_redis_up`` :mod:`gateway.state.redis_health`.

A Redis URL may carry a password: messages show it as :func:`redacted`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast
from urllib.parse import unquote, urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
from redis.backoff import NoBackoff
from redis.exceptions import ClusterDownError, OutOfMemoryError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.errors import StoreFullError, StoreUnavailableError
from gateway.outages import Outage
from gateway.state.connections import (
    SentinelComingBack,
    WaitingPool,
    WaitingSentinelPool,
    coming_back,
)

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


#: How long a Redis restart is taken to last until one was seen to end (``gateway up``
#: starts a Redis that died again within about a second, its data read back from the
#: append-only file).
REDIS_RESTART_S = 2.0


def connect(
    url: str, timeout_s: float, max_connections: int, outage: Outage | None = None
) -> Redis:
    """A client with short timeouts and one immediate retry: the retry replaces a pooled
    connection that died with a restarted Redis; a Redis that is really down fails at once.

    At most ``max_connections`` connections are open at once; a command that finds them all
    busy waits up to ``timeout_s`` for one, then fails like a Redis that does not answer
    (redis-py's own pool would refuse it at once: from redis-py 8 it holds 100 by default).
    With ``outage`` (what this process knows of Redis's outages), a connection to a Redis
    coming back waits for it (see :class:`~gateway.state.connections.ComingBack`); not with a
    Cluster.
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
        pool = WaitingPool.from_url(
            url, max_connections=max_connections, wait_s=timeout_s, **options
        )
        if outage is not None:
            pool.connection_class = coming_back(pool.connection_class)
            pool.connection_kwargs["outage"] = outage
        return Redis.from_pool(pool)
    nodes, service, db, password = parse_sentinel_url(url)
    waiting: dict[str, Any] = {}
    if outage is not None:
        managed = coming_back(SentinelManagedConnection, SentinelComingBack)
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
        connection_pool_class=WaitingSentinelPool,
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
            retry_after = getattr(exc, "retry_after_s", None)  # see connections.ComingBack
            if retry_after is not None:
                error.headers["Retry-After"] = str(retry_after)
            raise error from exc

    return wrapper


@needs_store
async def ping(redis: Redis) -> bool:
    return bool(await redis.ping())
