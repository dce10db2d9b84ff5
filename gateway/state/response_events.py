"""Background responses in Redis (``/v1/responses`` with ``background: true``): which ones a
key has running and their leases, how each one ended, and its event log, so that any
replica can retrieve, follow or cancel a response another replica runs.

Per response ``R`` of the key ``K`` (all in ``K``'s Redis Cluster slot, ``{K}``):

- ``gw:background:{K}:running``: a sorted set of the key's running responses, each scored
  by the end of its lease (``lua/background.lua``). The replica that runs ``R`` renews its
  lease every third of ``background_lease_s``; a replica that dies stops renewing, so its
  responses stop counting against ``max_background_per_key`` after one lease, and a reader
  that finds ``R`` still ``queued``/``in_progress`` without a lease reports it ``failed``.
- ``gw:background:{K}:end:R``: the status ``R`` ended with and the :data:`Party` that
  claimed it, set once: the one place where a finish, a cancel and a reader's "its replica
  died" race, so exactly one of them decides (the run alone may change its own end: a
  failure after it claimed ``completed``). A delete overrides any end (``deleted``). The
  running replica stops at its next renewal, or its next event, once another party
  claimed it.
- ``gw:background:{K}:events:R``: a Redis Stream of ``R``'s SSE events as they were sent
  (entry id ``0-(sequence_number + 1)``), ending with an entry ``end``: what
  ``retrieve(stream=True, starting_after=N)`` replays and follows. A party logs only while
  no other party claimed the end, and nothing is logged once ``R`` was deleted, in the same
  script run as the check: a delete's removal of the log is never undone.

Everything expires with the response's record, ``responses_ttl_s`` after it was written.
"""

from __future__ import annotations

from typing import Any, Literal

from redis.asyncio import Redis

from gateway.state.redis import PREFIX, needs_store
from gateway.state.scripts import register

#: Events one read returns at most (a follower reads again at once when it got this many).
READ_COUNT = 500
#: Who claims a response's end: the replica that runs it, a cancel, or a reader that found
#: its lease ended (its replica died).
Party = Literal["run", "cancel", "reader"]
#: The end of a deleted response.
DELETED = "deleted"


def _scope(owner: str) -> str:
    return f"{PREFIX}background:{{{owner}}}"


class BackgroundRuns:
    """The running set, the ends and the event logs of background responses (see the
    module's docstring)."""

    def __init__(self, redis: Redis, ttl_s: int, lease_s: float) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.lease_ms = int(lease_s * 1000)
        self._script = register(redis, "background")

    @staticmethod
    def _end(owner: str, response_id: str) -> str:
        return f"{_scope(owner)}:end:{response_id}"

    @staticmethod
    def _events(owner: str, response_id: str) -> str:
        return f"{_scope(owner)}:events:{response_id}"

    async def _run(self, owner: str, response_id: str, op: str, *args: int | str) -> int:
        keys = [
            f"{_scope(owner)}:running",
            self._end(owner, response_id),
            self._events(owner, response_id),
        ]
        return int(await self._script(keys=keys, args=[op, response_id, *args]))

    @needs_store
    async def start(self, owner: str, response_id: str, limit: int) -> bool:
        """Takes a running place and a lease for ``response_id``; false when the key already
        runs ``limit`` background responses."""
        return bool(await self._run(owner, response_id, "start", limit, self.lease_ms))

    @needs_store
    async def renew(self, owner: str, response_id: str) -> bool:
        """Renews the lease; false once another party than the run claimed the response's
        end (stop running it)."""
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
    async def claim(self, owner: str, response_id: str, status: str, party: Party) -> bool:
        """Sets how the response ended, unless that is set already (the run may change its
        own): whether ``status`` is now its end (:meth:`ended` reads it)."""
        end = f"{status} {party}"
        return bool(await self._run(owner, response_id, "claim", end, self.ttl_s * 1000))

    @needs_store
    async def ended(self, owner: str, response_id: str) -> str | None:
        """How the response ended, if it has (:data:`DELETED`: it was deleted)."""
        ended = await self.redis.get(self._end(owner, response_id))
        return None if ended is None else str(ended).split(" ")[0]

    @needs_store
    async def append(
        self, owner: str, response_id: str, sequence: int, sse: str, party: Party
    ) -> bool:
        """Adds the event numbered ``sequence`` (its SSE text) to the response's log, unless
        another party than ``party`` claimed its end: whether it was logged."""
        ms = self.ttl_s * 1000
        return bool(await self._run(owner, response_id, "append", sequence, sse, ms, party))

    @needs_store
    async def close(self, owner: str, response_id: str, sequence: int) -> bool:
        """Ends the response's log (``sequence``: the number after its last event), unless it
        was deleted or ended already: whether this call ended it."""
        return bool(await self._run(owner, response_id, "close", sequence, self.ttl_s * 1000))

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
    async def delete(self, owner: str, response_id: str) -> None:
        """Marks the response deleted (its end, whatever it was) and deletes its event log,
        at once: a run that goes on logs nothing more, and sees it deleted."""
        await self._run(owner, response_id, "delete", self.ttl_s * 1000)
