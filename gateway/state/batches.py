"""Batches in Redis (``/v1/batches``): each batch's record, its lines and the progress of
its work, so that every replica works on every batch and any replica answers for any other
(the work itself: :mod:`gateway.serving.batches`).

**Layout.** Every Redis key of one batch carries the batch id as its Redis Cluster hash tag
(``gw:batch:{<id>}:...``, one slot, so one script moves its work):

- ``rec``: what never changes once the batch is made (JSON: the public fields, the owner's
  key id and key hash, the model), ``status`` (a string), ``times`` (a hash of
  ``<status>_at``), ``counts`` (``total``, ``completed``, ``failed``, token sums, each
  line's ``attempts:<index>``), ``files`` (``output_file_id``, ``error_file_id``);
- the work (``lua/batch.lua``): ``lines`` (index -> the request line), ``todo`` (indexes
  not leased), ``leases`` (index -> the end of its lease), ``done`` (indexes answered),
  ``output`` and ``errors`` (the result lines, in the order they were answered).

**Exactly once.** A line is leased to one replica at a time; the replica renews its leases
while it works (:data:`LEASE_S`), so a lease ends only when its replica died (or lost Redis
that long): the next claim puts the line back in ``todo`` and another replica answers it.
``finish`` adds the line's index to ``done`` and its result to ``output``/``errors`` in one
script run, and drops a second result for the same index: the output holds one line per
request, no gap, no duplicate. Usage is counted by the request itself (its admission, as a
live request's): a line whose replica died before answering was never settled there, so it
counts once, where it is answered.

A per-key index (``gw:batches:{<owner>}:index``, ids by creation time) lists a key's
batches; ``gw:batches:active`` lists the batches some replica may have work for (validated
and not yet finalized). Every key of a batch expires :data:`KEEP_S` after its window ends;
its lines go once it is finalized.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from gateway.errors import NotFoundError
from gateway.state.redis import PREFIX, needs_store
from gateway.state.scripts import register

#: How long a replica holds a line without renewing it: past it, the line is another's.
LEASE_S = 30.0
#: How long a replica may take to write a batch's files before another takes over.
FINALIZE_S = 300.0
#: How long a batch is kept after its window ends (its record, counts and status).
KEEP_S = 30 * 24 * 3600
#: The statuses of a batch that still has work (claimed, cancelled or finalized by some
#: replica); the others are ends.
LIVE = ("validating", "in_progress", "cancelling", "finalizing")
_ACTIVE = f"{PREFIX}batches:active"
#: The keys ``lua/batch.lua`` takes, in its order (``KEYS[1]`` to ``KEYS[9]``).
_WORK = ("status", "times", "todo", "lines", "leases", "done", "output", "errors", "counts")
#: What is dropped once the batch has ended.
_DROPPED = ("lines", "todo", "leases", "done", "output", "errors")


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(16)}"


def _keys(batch_id: str) -> list[str]:
    return [f"{PREFIX}batch:{{{batch_id}}}:{name}" for name in _WORK]


def _key(batch_id: str, name: str) -> str:
    return f"{PREFIX}batch:{{{batch_id}}}:{name}"


def _index(owner: str) -> str:
    return f"{PREFIX}batches:{{{owner}}}:index"


def _live(owner: str) -> str:
    return f"{PREFIX}batches:{{{owner}}}:live"


@dataclass(frozen=True)
class Claimed:
    """A line leased to this replica: its index in the input file (0-based) and its text."""

    index: int
    line: str


class BatchStore:
    """The batches' records and their work (see the module's docstring)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._work = register(redis, "batch")

    async def _run(self, batch_id: str, *args: Any) -> Any:
        return await self._work(keys=_keys(batch_id), args=[str(a) for a in args])

    @needs_store
    async def create(
        self, record: dict[str, Any], status: str, lines: list[str], ttl_s: int
    ) -> None:
        """Stores a new batch: ``record`` (its fixed fields, with ``id``, ``owner`` and
        ``created_at``), its ``status`` and, to run, its ``lines`` (all in ``todo``)."""
        batch_id, owner = record["id"], record["owner"]
        now = record["created_at"]
        # Not one MULTI: a 32 MB file would be one command's worth; each piece is its own.
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(_key(batch_id, "rec"), json.dumps(record), ex=ttl_s)
        pipe.set(_key(batch_id, "status"), status, ex=ttl_s)
        pipe.hset(_key(batch_id, "times"), f"{status}_at", now)
        pipe.expire(_key(batch_id, "times"), ttl_s)
        pipe.hset(_key(batch_id, "counts"), mapping={"total": len(lines)})
        pipe.expire(_key(batch_id, "counts"), ttl_s)
        for start in range(0, len(lines), 1000):
            chunk = {str(start + i): line for i, line in enumerate(lines[start : start + 1000])}
            pipe.hset(_key(batch_id, "lines"), mapping=chunk)  # type: ignore[arg-type]
            pipe.rpush(_key(batch_id, "todo"), *chunk)
        for name in ("lines", "todo"):
            pipe.expire(_key(batch_id, name), ttl_s)
        pipe.zadd(_index(owner), {batch_id: now})
        pipe.expire(_index(owner), ttl_s)
        await pipe.execute()
        if status in LIVE:
            await self.redis.zadd(_ACTIVE, {batch_id: now})

    @needs_store
    async def get(self, owner: str | None, batch_id: str) -> dict[str, Any]:
        """The batch as stored (record, status, times, counts, files); 404 for an unknown
        id, or another key's batch when ``owner`` is given."""
        pipe = self.redis.pipeline(transaction=False)
        for name in ("rec", "status", "times", "counts", "files"):
            getter = pipe.get if name in ("rec", "status") else pipe.hgetall
            getter(_key(batch_id, name))
        rec, status, times, counts, files = await pipe.execute()
        if rec is None or status is None:
            raise _unknown(batch_id)
        record: dict[str, Any] = json.loads(rec)
        if owner is not None and record["owner"] != owner:
            raise _unknown(batch_id)
        record["status"] = _text(status)
        record["times"] = {_text(k): int(v) for k, v in times.items()}
        record["counts"] = {
            _text(k): int(v)
            for k, v in counts.items()
            if not _text(k).startswith("attempts:") and _text(k) != "result_bytes"
        }
        record["files"] = {_text(k): _text(v) for k, v in files.items()}
        return record

    @needs_store
    async def page(self, owner: str, after: str | None, limit: int) -> tuple[list[str], bool]:
        """The key's batch ids, newest first, after ``after`` (one of them); whether more
        follow."""
        index = _index(owner)
        ids = [_text(i) for i in await self.redis.zrevrange(index, 0, -1)]
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        return ids[:limit], len(ids) > limit

    @needs_store
    async def active(self) -> list[str]:
        return [_text(i) for i in await self.redis.zrange(_ACTIVE, 0, -1)]

    @needs_store
    async def retire(self, batch_id: str, owner: str | None) -> None:
        """The batch has ended (its files are written): no replica looks at it again, and
        its work is dropped (lines, queue, leases, results); its record, status, counts and
        files stay until they expire."""
        await self.redis.zrem(_ACTIVE, batch_id)
        if owner is not None:
            await self.redis.zrem(_live(owner), batch_id)
        await self.redis.delete(*(_key(batch_id, n) for n in _DROPPED))

    @needs_store
    async def admit_live(self, owner: str, batch_id: str, ends_at: int, limit: int) -> int:
        """Counts the batch among the key's batches not yet ended (each until it is retired,
        or its window ends): how many there were before; it is not counted when they were
        ``limit`` already."""
        key, now = _live(owner), time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.zremrangebyscore(key, "-inf", now)
        pipe.zadd(key, {batch_id: ends_at})
        pipe.zcard(key)
        pipe.expire(key, max(int(ends_at - now), 1))
        *_, count, _ = await pipe.execute()
        if int(count) > limit:
            await self.redis.zrem(key, batch_id)
        return int(count) - 1

    @needs_store
    async def live(self, owner: str) -> int:
        """How many of the key's batches have not ended."""
        key = _live(owner)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zremrangebyscore(key, "-inf", time.time())
        pipe.zcard(key)
        _, count = await pipe.execute()
        return int(count)

    @needs_store
    async def forget_live(self, owner: str, batch_id: str) -> None:
        await self.redis.zrem(_live(owner), batch_id)

    @needs_store
    async def claim(self, batch_id: str, n: int, lease_s: float = LEASE_S) -> list[Claimed]:
        found = await self._run(batch_id, "claim", n, int(lease_s * 1000))
        return [Claimed(int(found[i]), _text(found[i + 1])) for i in range(0, len(found), 2)]

    @needs_store
    async def renew(self, batch_id: str, indexes: list[int], lease_s: float = LEASE_S) -> int:
        if not indexes:
            return 0
        return int(await self._run(batch_id, "renew", int(lease_s * 1000), *indexes))

    @needs_store
    async def finish(
        self,
        batch_id: str,
        index: int,
        ok: bool,
        line: str,
        tokens: tuple[int, int, int],
        cap: int,
        short: str,
    ) -> int:
        """Records line ``index``'s result (``short`` instead, failed, when the batch's
        results would pass ``cap`` bytes); the lines left to answer, or -1 when it had been
        answered already or the batch ended (this result is dropped)."""
        kind = "completed" if ok else "failed"
        return int(await self._run(batch_id, "finish", index, kind, line, *tokens, cap, short))

    @needs_store
    async def retry(self, batch_id: str, index: int, max_attempts: int) -> int:
        return int(await self._run(batch_id, "retry", index, max_attempts))

    @needs_store
    async def release(self, batch_id: str, indexes: list[int]) -> None:
        if indexes:
            await self._run(batch_id, "release", *indexes)

    @needs_store
    async def move(self, batch_id: str, to: str, *sources: str) -> bool:
        """Sets the status to ``to`` (and its time) if it is one of ``sources``."""
        moved = await self._run(batch_id, "move", to, int(time.time()), *sources)
        return bool(moved)

    @needs_store
    async def leased(self, batch_id: str) -> int:
        return int(await self._run(batch_id, "leased"))

    @needs_store
    async def results(self, batch_id: str) -> tuple[list[str], list[str]]:
        """The output and error lines, in the order they were answered."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.lrange(_key(batch_id, "output"), 0, -1)
        pipe.lrange(_key(batch_id, "errors"), 0, -1)
        output, errors = await pipe.execute()
        return [_text(x) for x in output], [_text(x) for x in errors]

    @needs_store
    async def unanswered(self, batch_id: str) -> list[Claimed]:
        """The lines not answered (an expired batch's), by index."""
        lines = await self.redis.hgetall(_key(batch_id, "lines"))
        done = {int(i) for i in await self.redis.smembers(_key(batch_id, "done"))}
        left = sorted((int(k), _text(v)) for k, v in lines.items() if int(k) not in done)
        return [Claimed(i, line) for i, line in left]

    @needs_store
    async def set_files(self, batch_id: str, files: dict[str, str], ttl_s: int) -> None:
        if files:
            await self.redis.hset(_key(batch_id, "files"), mapping=files)  # type: ignore[arg-type]
            await self.redis.expire(_key(batch_id, "files"), ttl_s)

    @needs_store
    async def finalizer(self, batch_id: str, worker: str, lease_s: float = FINALIZE_S) -> bool:
        """Whether ``worker`` (a replica's worker) now finalizes the batch: none else does,
        or the one that did died (its lock ended)."""
        lock = _key(batch_id, "finalizer")
        return bool(await self.redis.set(lock, worker, nx=True, px=int(lease_s * 1000)))

    @needs_store
    async def queued(self, ids: list[str]) -> int:
        """Lines waiting in the batches ``ids`` (every active batch: the metrics' gauge)."""
        if not ids:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for batch_id in ids:
            pipe.llen(_key(batch_id, "todo"))
        return sum(int(n) for n in await pipe.execute())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _unknown(batch_id: str) -> NotFoundError:
    return NotFoundError(f"No batch found with id '{batch_id}'.", param="batch_id")
