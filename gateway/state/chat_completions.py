"""Stored chat completions (``store: true`` on ``/v1/chat/completions``): what
``GET /v1/chat/completions`` lists, what retrieve, update, delete and the messages list
read, kept in Redis so any replica answers for any other.

A completion made with ``store: true`` is kept under the key that made it, for
``responses_ttl_s`` seconds from when it was stored (an update of its metadata keeps that
end). Another key's completion does not exist for a caller, exactly as an unknown id (404).

**Layout.** Every Redis key of one API key's stored completions carries the key id as its
Redis Cluster hash tag (one slot, so one ``MGET`` reads a page): the record
(``gw:chatcmpl:{<id>}:rec:<completion id>``, the completion object and the request's
messages, with its TTL), an index (``...:index``, a sorted set of completion ids scored by
when each was stored, in microseconds) and a hash of each completion's summary
(``...:summaries``: its model and a 64-bit digest of each metadata pair, at most about 350
bytes), which the list's filters read without reading whole records. The index and the hash
expire with the newest record; entries whose record's TTL has passed are trimmed from both
whenever the key stores or lists (at most :data:`TRIM_PER_RUN` at a time), and an entry
whose record is gone (deleted by another replica meanwhile) is skipped. Only ids of the
gateway's form (``chatcmpl-`` and letters, digits, ``_`` or ``-``) name a record: any other
is a 404 as an unknown id. A record stored before the ``rec:`` prefix
(``gw:chatcmpl:{<id>}:<completion id>``, with its whole metadata as its summary) is still
read, listed, filtered, updated and deleted until it expires.

**Bounds.** A record is at most ``max_stored_kb`` KB of JSON: a larger one is refused with
a 400 ``stored_record_too_large`` naming ``store`` (``metadata`` for an update) and nothing
is written. A key keeps at most ``max_stored_chat_completions`` of them (403
``storage_quota_exceeded`` before generating; requests running at once may pass it by
their number), so a list, filtered or not, reads at most that many summaries: with the
default 10 000, at most about 3.5 MB in 20 reads of :data:`SCAN_BATCH`, 0.05 s for a filter
that matches none (measured), and a summary without the filter's digests is not parsed.
Records count towards the key's and its project's stored bytes
(:mod:`gateway.state.stored_bytes`) with their summary and index entries
(:data:`LIST_ENTRY_OVERHEAD`): :meth:`ChatCompletionStore.hold` takes the room a record
needs before anything is generated, :meth:`ChatCompletionStore.save` counts what it really
takes, an update that grows a record holds the growth first (403
``storage_quota_exceeded`` naming ``metadata`` past a quota),
:meth:`ChatCompletionStore.delete` gives it back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel
from redis.asyncio import Redis

from gateway.config import Settings
from gateway.errors import InvalidRequestError, NotFoundError, PermissionDeniedError
from gateway.state.redis import PREFIX, needs_store
from gateway.state.stored_bytes import Hold, StoredBytes, bounded_json

DEFAULT_MAX_STORED_KB: int = Settings.model_fields["max_stored_kb"].default
DEFAULT_MAX_COUNT: int = Settings.model_fields["max_stored_chat_completions"].default
#: Index entries past their TTL removed by one trim (the rest go at the next).
TRIM_PER_RUN = 1000
#: Index entries one step of a list reads (with their summaries).
SCAN_BATCH = 500
#: What Redis keeps for a completion's index entry and summary beside their bytes (their
#: entries in the sorted set and the hash): ``used_memory`` grew by 307 bytes per
#: completion for 117 bytes of ids and summary (10 000 completions), measured on Redis 7.
LIST_ENTRY_OVERHEAD = 192
#: The ids the gateway gives stored completions (``chatcmpl-<hex>``): any other names none.
_ID = re.compile(r"chatcmpl-[A-Za-z0-9_-]{1,100}")
#: What a client may do instead when its key's stored bytes are full.
_INSTEAD = "send smaller metadata"


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
        return f"{PREFIX}chatcmpl:{{{owner}}}:rec:{completion_id}"

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
        return bounded_json(
            stored,
            self.max_stored_kb,
            param,
            "Stored with its messages, this chat completion is",
            "Send fewer or shorter messages, or store: false.",
        )

    @staticmethod
    def _counted(stored: StoredChatCompletion, raw: str, summary: str) -> int:
        """What a record counts for in stored bytes: its JSON, its summary and its index
        entry."""
        return len(raw.encode()) + len(summary.encode()) + 2 * len(stored.id) + LIST_ENTRY_OVERHEAD

    async def _find(self, owner: str, completion_id: str) -> tuple[str, str]:
        """The Redis key and the JSON of the caller's stored completion, or a 404."""
        if not _ID.fullmatch(completion_id):
            raise not_found(completion_id)
        key = self._key(owner, completion_id)
        raw = await self.redis.get(key)
        if raw is None:
            raise not_found(completion_id)
        return key, str(raw)

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
        size = self._counted(stored, self.encode(stored), _summary(stored.completion))
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
        summary = _summary(stored.completion)
        size = self._counted(stored, raw, summary)
        await self.stored_bytes.put(owner, entry, size, self.ttl_s, hold)
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
        return StoredChatCompletion.model_validate_json((await self._find(owner, completion_id))[1])

    @needs_store
    async def update(
        self, owner: str, completion_id: str, metadata: dict[str, str] | None
    ) -> StoredChatCompletion:
        """Replaces the metadata of the caller's stored completion (``None``: none), keeping
        when it expires; a 404 when there is none, 403 ``storage_quota_exceeded`` when what
        the record grows by takes its key or project past a quota."""
        key, raw = await self._find(owner, completion_id)
        stored = StoredChatCompletion.model_validate_json(raw)
        before = self._counted(stored, raw, _summary(stored.completion))
        stored.completion["metadata"] = metadata or {}
        raw = self.encode(stored, param="metadata")
        summary = _summary(stored.completion)
        size = self._counted(stored, raw, summary)
        left_ms = await self.redis.pttl(key)
        if left_ms <= 0:
            raise not_found(completion_id)
        entry = self._entry(completion_id)
        held: Hold | None = None
        try:
            if size > before:
                held = await self.stored_bytes.hold(
                    owner, entry, size - before, "metadata", _INSTEAD
                )
            await self.stored_bytes.put(owner, entry, size, left_ms / 1000, held)
            held = None  # counted in the record's entry now
        finally:
            await self.stored_bytes.release(held)
        # The summary first, the record then with XX: an update racing a delete never
        # brings either back (the delete removes the summary after the record).
        await self.redis.hset(self._summaries(owner), completion_id, summary)
        if not await self.redis.set(key, raw, xx=True, keepttl=True):
            await self.redis.hdel(self._summaries(owner), completion_id)
            await self.stored_bytes.drop(owner, entry)
            raise not_found(completion_id)
        return stored

    @needs_store
    async def delete(self, owner: str, completion_id: str) -> None:
        """Deletes the caller's stored completion (a 404 when there is none) and gives back
        the bytes it took."""
        if not _ID.fullmatch(completion_id):
            raise not_found(completion_id)
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
        wanted = _Filter(model, metadata or {})
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
                if summary is not None and wanted.matches(str(summary)):
                    matched.append(completion_id)
            bound = f"({int(scored[-1][1])}"
            if len(scored) < SCAN_BATCH:
                break
        page = matched[:limit]
        raws = await self.redis.mget([self._key(owner, i) for i in page]) if page else []
        records = [StoredChatCompletion.model_validate_json(raw) for raw in raws if raw]
        return Page(records, len(matched) > limit)


def _pair(key: str, value: str) -> str:
    """A metadata pair's digest, as a summary keeps it."""
    return hashlib.blake2b(json.dumps([key, value]).encode(), digest_size=8).hexdigest()


def _summary(completion: dict[str, Any]) -> str:
    """What the list's filters read of a completion: its model and its metadata pairs'
    digests (a JSON list)."""
    metadata: dict[str, str] = completion.get("metadata") or {}
    return json.dumps([completion["model"], sorted(_pair(k, v) for k, v in metadata.items())])


@dataclass(frozen=True, slots=True)
class _Filter:
    """A list's filters, matched against summaries (the digests looked for in the
    summary's text before it is parsed: a summary without them is skipped unread)."""

    model: str | None
    metadata: dict[str, str]

    def matches(self, summary: str) -> bool:
        digests = [_pair(k, v) for k, v in self.metadata.items()]
        if not all(digest in summary for digest in digests):
            return False
        model, kept = json.loads(summary)
        return (self.model is None or model == self.model) and set(digests) <= set(kept)
