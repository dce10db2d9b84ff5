"""Where each stored item lives, per key: what an ``item_reference`` input item (``{"type":
"item_reference", "id": "msg_..."}``) is resolved through.

An item is stored inside a record: a stored response (its input items and its output) or a
conversation (:mod:`gateway.state.conversations`). The index keeps, for each item id of a
key, the record that holds it (its stored-bytes entry name, ``response:<id>`` or
``conversation:<id>``), one small Redis string per item (``gw:item:<key id>:<item id>``),
expiring with the record's TTL. Another key's item is not in the caller's index: it does
not exist for them, as an unknown id.

A response's items are indexed each time it is stored, each only if not already indexed (an
item of the ``previous_response_id`` chain keeps pointing at the response that made it
first). A conversation indexes all of its items at each write, which also renews their
expiry with the conversation's; entries written after the conversation was deleted (a
delete racing the write) are removed again.

**Stored bytes.** The entries count towards the key's stored bytes as
:data:`ENTRY_OVERHEAD` plus the bytes of their key and value each: a response's under an
entry of their own (``items:response:<id>``, never refused, like the record), a
conversation's inside the conversation's own entry. Each time a response is stored (a
background response is stored as it runs, several times) its entry counts every entry that
points at it, those written then and before alike, so the count never shrinks as a
response is saved again (it shrinks when a conversation takes an item over: the
conversation counts it then). An entry of a deleted response is not removed (it names the
record only, no content): it fails to resolve and stays counted until it expires, as it
stays in Redis until then.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis

from gateway.state.redis import PREFIX, needs_store
from gateway.state.stored_bytes import StoredBytes

#: What Redis keeps beside an index entry's key and value (its object headers, its expiry):
#: ``used_memory`` grew by 278 bytes per entry of 135 bytes of key and value (10 000
#: entries with a TTL), measured on Redis 7.
ENTRY_OVERHEAD = 144


def _key(owner: str, item_id: str) -> str:
    return f"{PREFIX}item:{owner}:{item_id}"


def entry_bytes(owner: str, location: str, item_ids: Iterable[str]) -> int:
    """The bytes the index entries of ``item_ids`` (held by ``location``) count for."""
    fixed = len(location.encode()) + ENTRY_OVERHEAD
    return sum(len(_key(owner, item_id).encode()) + fixed for item_id in item_ids)


class ItemIndex:
    """The item ids of each key and the record holding each."""

    def __init__(self, redis: Redis, stored_bytes: StoredBytes | None = None) -> None:
        self.redis = redis
        self.stored_bytes = stored_bytes or StoredBytes(redis)

    @needs_store
    async def add_response(
        self, owner: str, location: str, items: Iterable[dict[str, Any]], ttl_s: int
    ) -> None:
        """Indexes a stored response's items (those not indexed yet) under ``location``,
        and counts in the key's stored bytes every entry that points at it (written now
        or by an earlier save of the same response), in one pipeline: each id's ``SET NX``
        then its ``GET`` (no write where the entry exists)."""
        ids = list(dict.fromkeys(str(item["id"]) for item in items if item.get("id")))
        if not ids:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for item_id in ids:
                pipe.set(_key(owner, item_id), location, ex=ttl_s, nx=True)
                pipe.get(_key(owner, item_id))
            found = (await pipe.execute())[1::2]
        ours = [item_id for item_id, raw in zip(ids, found, strict=True) if raw == location]
        if ours:
            size = entry_bytes(owner, location, ours)
            await self.stored_bytes.put(owner, f"items:{location}", size, ttl_s, None)

    @needs_store
    async def point(
        self,
        owner: str,
        location: str,
        item_ids: Iterable[str],
        ttl_s: int,
        record: str | None = None,
    ) -> None:
        """Points ``item_ids`` at ``location`` (a conversation, which counts them in its own
        stored bytes), renewing their expiry; with ``record`` (the conversation's Redis
        key), removes them again when it is gone by then (deleted meanwhile)."""
        ids = list(item_ids)
        async with self.redis.pipeline(transaction=False) as pipe:
            for item_id in ids:
                pipe.set(_key(owner, item_id), location, ex=ttl_s)
            await pipe.execute()
        # Once they are written (a cluster's pipeline runs in no set order across nodes).
        if record is not None and not await self.redis.exists(record):
            await self.forget(owner, location, ids)

    @needs_store
    async def locate(self, owner: str, item_ids: list[str]) -> list[str | None]:
        """The record holding each of the caller's items ``item_ids`` (None for one it has
        not stored), in one pipeline."""
        if not item_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for item_id in item_ids:
                pipe.get(_key(owner, item_id))
            found = await pipe.execute()
        return [None if raw is None else str(raw) for raw in found]

    @needs_store
    async def forget(self, owner: str, location: str, item_ids: Iterable[str]) -> None:
        """Removes the entries of ``item_ids`` that still point at ``location`` (an item
        indexed since by another record keeps its entry)."""
        ids = list(item_ids)
        if not ids:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for item_id in ids:
                pipe.get(_key(owner, item_id))
            found = await pipe.execute()
        ours = [
            _key(owner, item_id) for item_id, raw in zip(ids, found, strict=True) if raw == location
        ]
        if ours:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in ours:
                    pipe.delete(key)
                await pipe.execute()
