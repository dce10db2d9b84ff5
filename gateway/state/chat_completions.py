"""Stored chat completions (``store: true`` on ``/v1/chat/completions``): what
``GET /v1/chat/completions`` lists, what retrieve, update, delete and the messages list
read, kept in Redis so any replica answers for any other.

A completion made with ``store: true`` is kept under the key that made it, for
``responses_ttl_s`` seconds from when it was stored (an update of its metadata keeps that
end). Another key's completion does not exist for a caller, exactly as an unknown id (404).

**Layout.** Every Redis key of one API key's stored completions carries the key id as its
Redis Cluster hash tag (one slot, so one ``MGET`` reads a page): the record
(``gw:chatcmpl:{<id>}:<completion id>``, the completion object and the request's messages,
with its TTL), an index (a sorted set of completion ids scored by when each was stored, in
microseconds) and a hash of each completion's model and metadata, which the list's filters
read without reading whole records. The index and the hash expire with the newest record;
entries whose record's TTL has passed are trimmed from both whenever the key stores or
lists (at most :data:`TRIM_PER_RUN` at a time), and an entry whose record is gone
(deleted by another replica meanwhile) is skipped.

**Bounds.** A record is at most ``max_stored_kb`` KB of JSON: a larger one is refused with
a 400 ``stored_record_too_large`` naming ``store`` (``metadata`` for an update) and nothing
is written. A key keeps at most ``max_stored_chat_completions`` of them (403
``storage_quota_exceeded`` before generating; requests running at once may pass it by
their number), so a filtered list reads at most that many small index entries. Records
count towards the key's and its project's stored bytes (:mod:`gateway.state.stored_bytes`):
:meth:`ChatCompletionStore.hold` takes the room a record needs before anything is
generated, :meth:`ChatCompletionStore.save` counts what it really takes,
:meth:`ChatCompletionStore.delete` gives it back.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel
from redis.asyncio import Redis

from gateway.config import Settings
from gateway.errors import InvalidRequestError, NotFoundError, PermissionDeniedError
from gateway.state.redis import PREFIX, needs_store
from gateway.state.stored_bytes import Hold, StoredBytes

DEFAULT_MAX_STORED_KB: int = Settings.model_fields["max_stored_kb"].default
DEFAULT_MAX_COUNT: int = Settings.model_fields["max_stored_chat_completions"].default
#: Index entries past their TTL removed by one trim (the rest go at the next).
TRIM_PER_RUN = 1000
#: Index entries one step of a list reads (with their model and metadata).
SCAN_BATCH = 500


class StoredChatCompletion(BaseModel):
    owner: str
    completion: dict[str, Any]
    """The ``chat.completion`` object as retrieve returns it, ``metadata`` included."""
    messages: list[dict[str, Any]]
    """The request's messages, each with its id (``<completion id>-<index>``), as the
    messages list returns them."""

    @property
    def id(self) -> str:
        return str(self.completion["id"])


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list: the records in order, and whether more match after them."""

    records: list[StoredChatCompletion]
    has_more: bool


def not_found(completion_id: str) -> NotFoundError:
    return NotFoundError(
        f"Chat completion with id '{completion_id}' not found.",
        param="completion_id",
        code="not_found",
    )


def _now_us() -> int:
    return time.time_ns() // 1000


class ChatCompletionStore:
    def __init__(
        self,
        redis: Redis,
        ttl_s: int,
        max_stored_kb: int = DEFAULT_MAX_STORED_KB,
        stored_bytes: StoredBytes | None = None,
        max_count: int = DEFAULT_MAX_COUNT,
    ) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.max_stored_kb = max_stored_kb
        self.stored_bytes = stored_bytes or StoredBytes(redis)
        self.max_count = max_count

    @staticmethod
    def _key(owner: str, completion_id: str) -> str:
        return f"{PREFIX}chatcmpl:{{{owner}}}:{completion_id}"

    @staticmethod
    def _index(owner: str) -> str:
        return f"{PREFIX}chatcmpl:{{{owner}}}:index"

    @staticmethod
    def _summaries(owner: str) -> str:
        return f"{PREFIX}chatcmpl:{{{owner}}}:summaries"

    @staticmethod
    def _entry(completion_id: str) -> str:
        return f"chatcmpl:{completion_id}"

    def encode(self, stored: StoredChatCompletion, param: str = "store") -> str:
        """The record as it is stored, or a 400 naming ``param`` when it is larger than
        ``max_stored_kb``."""
        raw = stored.model_dump_json()
        size = len(raw.encode())
        if size > self.max_stored_kb * 1024:
            raise InvalidRequestError(
                f"Stored with its messages, this chat completion is {size:,} bytes of JSON; "
                f"the gateway stores at most {self.max_stored_kb} KB per completion "
                "(GATEWAY_MAX_STORED_KB). Send fewer or shorter messages, or store: false.",
                param=param,
                code="stored_record_too_large",
            )
        return raw

    async def _trim(self, owner: str) -> None:
        """Removes from the index the entries whose record's TTL has passed."""
        index = self._index(owner)
        ended = _now_us() - self.ttl_s * 1_000_000
        gone = await self.redis.zrangebyscore(index, "-inf", f"({ended}", 0, TRIM_PER_RUN)
        if gone:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(index, *gone)
                pipe.hdel(self._summaries(owner), *gone)
                await pipe.execute()

    @needs_store
    async def hold(self, stored: StoredChatCompletion) -> Hold:
        """Checks that ``stored`` (the record as known before generating) fits the store and
        that its key may keep one more, then holds the room it takes in its key's and
        project's stored bytes (see :meth:`StoredBytes.hold` for the refusals)."""
        size = len(self.encode(stored).encode())
        await self._trim(stored.owner)
        if await self.redis.zcard(self._index(stored.owner)) >= self.max_count:
            raise PermissionDeniedError(
                f"This API key keeps {self.max_count:,} stored chat completions, the most it "
                "may (GATEWAY_MAX_STORED_CHAT_COMPLETIONS). Delete some (DELETE "
                "/v1/chat/completions/{id}), wait for them to expire, or send store: false.",
                param="store",
                code="storage_quota_exceeded",
            )
        entry = self._entry(stored.id)
        return await self.stored_bytes.hold(stored.owner, entry, size, "store", "send store: false")

    async def release(self, hold: Hold | None) -> None:
        """Gives back the room held for a completion that will not be stored."""
        await self.stored_bytes.release(hold)

    @needs_store
    async def save(self, stored: StoredChatCompletion, hold: Hold | None = None) -> None:
        """Stores the record whole, or nothing (a 400 when it is too large), counting it in
        place of ``hold``, and lists it. Not refused for a quota: :meth:`hold` checked."""
        owner, completion_id = stored.owner, stored.id
        raw = self.encode(stored)
        entry = self._entry(completion_id)
        await self.stored_bytes.put(owner, entry, len(raw.encode()), self.ttl_s, hold)
        summary = json.dumps(_summary(stored.completion))
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(self._key(owner, completion_id), raw, ex=self.ttl_s)
                pipe.zadd(self._index(owner), {completion_id: _now_us()})
                pipe.hset(self._summaries(owner), completion_id, summary)
                pipe.expire(self._index(owner), self.ttl_s)
                pipe.expire(self._summaries(owner), self.ttl_s)
                await pipe.execute()
        except BaseException:
            with contextlib.suppress(Exception):  # counted until its TTL at worst
                await self.stored_bytes.drop(owner, entry)
            raise

    @needs_store
    async def get(self, owner: str, completion_id: str) -> StoredChatCompletion:
        """The caller's stored completion, or a 404."""
        raw = await self.redis.get(self._key(owner, completion_id))
        if raw is None:
            raise not_found(completion_id)
        return StoredChatCompletion.model_validate_json(raw)

    @needs_store
    async def update(
        self, owner: str, completion_id: str, metadata: dict[str, str] | None
    ) -> StoredChatCompletion:
        """Replaces the metadata of the caller's stored completion (``None``: none), keeping
        when it expires; a 404 when there is none."""
        stored = await self.get(owner, completion_id)
        stored.completion["metadata"] = metadata or {}
        raw = self.encode(stored, param="metadata")
        left_ms = await self.redis.pttl(self._key(owner, completion_id))
        if left_ms <= 0:
            raise not_found(completion_id)
        entry = self._entry(completion_id)
        await self.stored_bytes.put(owner, entry, len(raw.encode()), left_ms / 1000, None)
        # XX: an update racing a delete never brings the record back.
        if not await self.redis.set(self._key(owner, completion_id), raw, xx=True, keepttl=True):
            await self.stored_bytes.drop(owner, entry)
            raise not_found(completion_id)
        summary = json.dumps(_summary(stored.completion))
        await self.redis.hset(self._summaries(owner), completion_id, summary)
        return stored

    @needs_store
    async def delete(self, owner: str, completion_id: str) -> None:
        """Deletes the caller's stored completion (a 404 when there is none) and gives back
        the bytes it took."""
        if not await self.redis.delete(self._key(owner, completion_id)):
            raise not_found(completion_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(self._index(owner), completion_id)
            pipe.hdel(self._summaries(owner), completion_id)
            await pipe.execute()
        await self.stored_bytes.drop(owner, self._entry(completion_id))

    @needs_store
    async def list(
        self,
        owner: str,
        *,
        model: str | None = None,
        metadata: dict[str, str] | None = None,
        after: str | None = None,
        limit: int = 20,
        order: str = "asc",
    ) -> Page:
        """The caller's stored completions in the order they were stored (``desc``: newest
        first), those of ``model`` and carrying every pair of ``metadata``, from the one
        after ``after`` (a 400 naming ``after`` when it is not one of the caller's)."""
        await self._trim(owner)
        index = self._index(owner)
        desc = order == "desc"
        bound: str = "+inf" if desc else "-inf"
        if after is not None:
            score = await self.redis.zscore(index, after)
            if score is None:
                raise InvalidRequestError(
                    f"No stored chat completion with id '{after}'.", param="after"
                )
            bound = f"({int(score)}"
        matched: list[str] = []
        while len(matched) <= limit:
            if desc:
                batch = await self.redis.zrevrangebyscore(
                    index, bound, "-inf", 0, SCAN_BATCH, withscores=True
                )
            else:
                batch = await self.redis.zrangebyscore(
                    index, bound, "+inf", 0, SCAN_BATCH, withscores=True
                )
            scored = cast(list[tuple[str, float]], batch)
            if not scored:
                break
            ids = [member for member, _ in scored]
            summaries = await self.redis.hmget(self._summaries(owner), ids)
            for completion_id, summary in zip(ids, summaries, strict=True):
                if summary is not None and _matches(json.loads(summary), model, metadata):
                    matched.append(completion_id)
            bound = f"({int(scored[-1][1])}"
            if len(scored) < SCAN_BATCH:
                break
        page = matched[:limit]
        raws = await self.redis.mget([self._key(owner, i) for i in page]) if page else []
        records = [StoredChatCompletion.model_validate_json(raw) for raw in raws if raw]
        return Page(records, len(matched) > limit)


def _summary(completion: dict[str, Any]) -> dict[str, Any]:
    """What the list's filters read of a completion."""
    return {"model": completion["model"], "metadata": completion.get("metadata") or {}}


def _matches(summary: dict[str, Any], model: str | None, metadata: dict[str, str] | None) -> bool:
    if model is not None and summary["model"] != model:
        return False
    pairs = summary["metadata"]
    return all(pairs.get(k) == v for k, v in (metadata or {}).items())
