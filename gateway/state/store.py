"""The Redis connection every replica shares, and the one place that turns "Redis is down"
into a clean 503.

Keys, sessions, rate-limit counters and usage live in Redis so that any number of gateway
processes behave as one. When Redis cannot be reached, a request that needs it fails fast
(at once when refused, after ``redis_timeout_s`` per try when unanswered) with
:class:`StoreUnavailableError`; nothing waits and nothing is let
through. The client's pool reconnects on the next command, so the gateway recovers by itself
when Redis returns.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.errors import StoreUnavailableError

#: Every key the gateway writes starts with this, so it can share a Redis with other apps.
PREFIX = "gw:"

P = ParamSpec("P")
T = TypeVar("T")


def connect(url: str, timeout_s: float) -> Redis:
    """A client with short timeouts and one immediate retry: the retry replaces a pooled
    connection that died with a restarted Redis; a Redis that is really down fails at once."""
    return Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )


def needs_store(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Marks a coroutine that talks to Redis: connection failures and timeouts become
    :class:`StoreUnavailableError` (503). Other Redis errors are bugs and stay 500s."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise StoreUnavailableError(
                "The gateway's store (Redis) is unreachable; try again shortly."
            ) from exc

    return wrapper


@needs_store
async def ping(redis: Redis) -> bool:
    return bool(await redis.ping())
