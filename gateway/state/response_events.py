"""Background responses in Redis (``/v1/responses`` with ``background: true``): which ones a
key has running and their leases, how each one ended, and its event log, so that any
replica can retrieve, follow or cancel a response another replica runs.

Per response ``R`` of the key ``K`` (all in ``K``'s Redis Cluster slot, ``{K}``):

- ``gw:background:{K}:running``: a sorted set of the key's running responses, each scored
  by the end of its lease (``background.lua``). The replica that runs ``R`` renews its
  lease every third of ``background_lease_s``; a replica that dies stops renewing, so its
  responses stop counting against ``max_background_per_key`` after one lease, and a reader
  that finds ``R`` still ``queued``/``in_progress`` without a lease reports it ``failed``.
- ``gw:background:{K}:end:R``: the status ``R`` ended with, set once (``SET NX``): the one
  place where a finish, a cancel and a reader's "its replica died" race, so exactly one of
  them decides. The running replica stops at its next renewal once it is set.
- ``gw:background:{K}:events:R``: a Redis Stream of ``R``'s SSE events as they were sent
  (entry id ``0-(sequence_number + 1)``), ending with an entry ``end``: what
  ``retrieve(stream=True, starting_after=N)`` replays and follows.

Everything expires with the response's record, ``responses_ttl_s`` after it was written.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

from redis.asyncio import Redis

from gateway.state.redis import PREFIX, needs_store

_SCRIPT = importlib.resources.files("gateway.state").joinpath("background.lua").read_text()
#: Events one read returns at most (a follower reads again at once when it got this many).
READ_COUNT = 500


def _scope(owner: str) -> str:
    return f"{PREFIX}background:{{{owner}}}"


class BackgroundRuns:
    """The running set, the ends and the event logs of background responses (see the
    module's docstring)."""

    def __init__(self, redis: Redis, ttl_s: int, lease_s: float) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.lease_ms = int(lease_s * 1000)
        self._script = redis.register_script(_SCRIPT)

    @staticmethod
    def _end(owner: str, response_id: str) -> str:
        return f"{_scope(owner)}:end:{response_id}"

    @staticmethod
    def _events(owner: str, response_id: str) -> str:
        return f"{_scope(owner)}:events:{response_id}"

    async def _run(self, owner: str, response_id: str, op: str, *args: int) -> int:
        keys = [f"{_scope(owner)}:running", self._end(owner, response_id)]
        return int(await self._script(keys=keys, args=[op, response_id, *args]))

    @needs_store
    async def start(self, owner: str, response_id: str, limit: int) -> bool:
        """Takes a running place and a lease for ``response_id``; false when the key already
        runs ``limit`` background responses."""
        return bool(await self._run(owner, response_id, "start", limit, self.lease_ms))

    @needs_store
    async def renew(self, owner: str, response_id: str) -> bool:
        """Renews the lease; false when the response has an end already (stop running it)."""
        return bool(await self._run(owner, response_id, "renew", self.lease_ms))

    @needs_store
    async def alive(self, owner: str, response_id: str) -> bool:
        """Whether a replica still runs the response (its lease has not ended)."""
        return bool(await self._run(owner, response_id, "alive"))

    @needs_store
    async def stop(self, owner: str, response_id: str) -> None:
        """The response no longer runs: its place is free."""
        await self._run(owner, response_id, "stop")

    @needs_store
    async def claim(self, owner: str, response_id: str, status: str) -> bool:
        """Sets how the response ended, unless that is set already: whether this call
        decided (:meth:`ended` then reads what was decided)."""
        key = self._end(owner, response_id)
        return bool(await self.redis.set(key, status, nx=True, ex=self.ttl_s))

    @needs_store
    async def ended(self, owner: str, response_id: str) -> str | None:
        """How the response ended, if it has."""
        ended = await self.redis.get(self._end(owner, response_id))
        return None if ended is None else str(ended)

    @needs_store
    async def append(self, owner: str, response_id: str, sequence: int, sse: str) -> None:
        """Adds the event numbered ``sequence`` (its SSE text) to the response's log."""
        key = self._events(owner, response_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(key, {"sse": sse}, id=f"0-{sequence + 1}")
            pipe.expire(key, self.ttl_s)
            await pipe.execute()

    @needs_store
    async def close(self, owner: str, response_id: str, sequence: int) -> None:
        """Ends the response's log (``sequence``: the number after its last event)."""
        key = self._events(owner, response_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(key, {"end": "1"}, id=f"0-{sequence + 1}")
            pipe.expire(key, self.ttl_s)
            await pipe.execute()

    @needs_store
    async def read(self, owner: str, response_id: str, after: int) -> list[tuple[int, str | None]]:
        """The logged events numbered after ``after``, oldest first, as (sequence number,
        SSE text), at most :data:`READ_COUNT`; the log's end reads as (n, None)."""
        key = self._events(owner, response_id)
        entries: Any = await self.redis.xrange(
            key, min=f"(0-{after + 1}", max="+", count=READ_COUNT
        )
        return [
            (int(entry_id.split("-")[1]) - 1, fields.get("sse")) for entry_id, fields in entries
        ]

    @needs_store
    async def forget(self, owner: str, response_id: str) -> None:
        """Deletes the response's event log (the response was deleted)."""
        await self.redis.delete(self._events(owner, response_id))
