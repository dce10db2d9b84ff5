"""Files of ``/v1/files``: what a key uploads (a Batch API input, data of its own) and what
the gateway makes for it (a batch's output), kept so that any replica serves any of them.

A file belongs to the key that made it: another key's file does not exist for a caller,
exactly as an unknown id (404, never "forbidden"); ids carry 96 random bits
(``file-`` and 24 hex digits, as OpenAI's).

**Where the bytes live** (:mod:`gateway.state.file_blobs`), chosen by one setting:

- **Redis** (the default, ``GATEWAY_FILES_DIR`` unset): every replica already shares it and
  nothing more has to be mounted or backed up, so a deployment gets files with no change.
  A file is kept in pieces of at most 1 MiB, each its own key with the record's expiry, so
  no Redis command moves more than 1 MiB and the file expires whole. The cost is Redis
  memory: the files' bytes count in the stored-bytes quotas and in the headroom
  (:class:`gateway.state.headroom.Headroom`: no upload once Redis is 80% full).
- **A directory** (``GATEWAY_FILES_DIR``) that every replica mounts (a ReadWriteMany volume
  in Kubernetes, an NFS export): for large files, or many, so that Redis's memory is not
  spent on them. A blob is written under a temporary name and renamed once complete, and
  every call to the file system runs in a thread.

The records stay in Redis in both cases, and a record says where its bytes are, so files
stored before the setting changed are still read (from Redis, or from the directory while it
is set).

**Layout** (every Redis key of one API key's files carries the key id as its Cluster hash
tag): the record (``gw:file:{<id>}:rec:<file id>``, with its expiry), the index of the
key's files (``...:index``, a sorted set scored by creation in microseconds), one per
purpose (``...:index:<purpose>``, which ``purpose=`` lists read) and the ends
(``...:ends``, ``<purpose>:<file id>`` scored by when each expires), through which the
indexes are trimmed of expired files whenever the key uploads or lists (at most
:data:`TRIM_PER_RUN` at a time). The indexes are kept for the longest a file may live.

**Lifetime.** ``expires_after`` (``{"anchor": "created_at", "seconds": 3600..2592000}``, as
OpenAI bounds it) sets ``expires_at``; without it a file is kept ``GATEWAY_FILES_TTL_DAYS``
(30), and its ``expires_at`` says when that ends. OpenAI keeps such a file until it is
deleted (a ``batch`` file 30 days); here every file ends, so what keys store stays
bounded. An expired file is gone (its keys by their TTL, a directory's blob at the next
sweep) and stops counting.

**Bounds and quota.** An upload is at most ``GATEWAY_MAX_FILE_MB``, counted as it is stored:
past it, 413 ``file_too_large`` naming ``file``, and what was written is removed. Its bytes
(with its record and index entries) count in its key's and project's stored bytes
(:mod:`gateway.state.stored_bytes`): the room is held as the pieces arrive, so an upload past
a quota is refused (403 ``storage_quota_exceeded``) as soon as it passes it, with nothing
left stored. A file the gateway makes for a key (``quota=False``: a batch's output, answers
the key already paid for) is counted the same way but never refused, neither for the quota
nor for ``GATEWAY_MAX_FILE_MB``: what made it bounds it. A delete gives the bytes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, cast

from pydantic import BaseModel
from redis.asyncio import Redis

from gateway.errors import (
    FileStorageError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
)
from gateway.metrics import Metrics
from gateway.state.file_blobs import (
    CHUNK_BYTES,
    BlobKind,
    BlobMissing,
    BlobRef,
    Blobs,
    BlobSink,
    DirectoryBlobs,
    RedisBlobs,
)
from gateway.state.redis import PREFIX, needs_store
from gateway.state.stored_bytes import MB, Hold, StoredBytes

#: ``expires_after.seconds``, as OpenAI bounds it.
MIN_EXPIRES_S = 3600
MAX_EXPIRES_S = 30 * 86_400
#: Expired index entries one trim removes (the rest go at the next).
TRIM_PER_RUN = 1000
#: Index entries one step of a list reads (with their records).
SCAN_BATCH = 1000
#: What a file's three index entries take in Redis, counted with its bytes and record.
INDEX_BYTES = 192
#: What a client may do instead when a key's stored bytes are full.
_INSTEAD = "delete files (DELETE /v1/files/{id})"
#: Only ids of the gateway's form name a record: any other is a 404 as an unknown id.
_ID = re.compile(r"file-[0-9a-f]{24}")
#: Clean-ups under way (a cancelled upload's pieces), kept referenced until they finish.
_CLEANING: set[asyncio.Task[None]] = set()


#: Files' kind among the records every key keeps (:meth:`StoredBytes.count_fleet`).
FILES = "files"


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def derived_file_id(*names: str) -> str:
    """The id of a file the gateway makes for ``names`` (a batch's id and which file): the
    same each time, so that a second try at making it replaces the first rather than
    leaving it beside."""
    return f"file-{hashlib.sha256(chr(0).join(names).encode()).hexdigest()[:24]}"


def not_found(file_id: str) -> NotFoundError:
    return NotFoundError(f"No such File object: {file_id}", param="file_id", code="not_found")


class StoredFile(BaseModel):
    """A file's record: its public fields, its owner, when it ends and where its bytes are."""

    owner: str
    id: str
    size: int
    created_at: int
    expires_at: int | None
    """``expires_after``'s end, or None (kept ``GATEWAY_FILES_TTL_DAYS``)."""
    ends_at: int
    """When the file is removed (Unix seconds): ``expires_at``, or the default lifetime's end."""
    filename: str
    purpose: str
    blobs: BlobKind

    def public(self) -> dict[str, Any]:
        """The file object, as openai-python's ``FileObject``."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.size,
            "created_at": self.created_at,
            # When it is removed: expires_after's end, or the default lifetime's (a client
            # that reads expires_at learns when the file is gone either way).
            "expires_at": self.ends_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }

    def ref(self) -> BlobRef:
        return BlobRef(self.owner, self.id, self.size, self.ends_at)


class FileStore:
    """The files of every key (see the module's docstring). ``directory``: keep the bytes
    there (``GATEWAY_FILES_DIR``) instead of in Redis."""

    def __init__(
        self,
        redis: Redis,
        stored_bytes: StoredBytes | None = None,
        *,
        max_file_mb: float = 32.0,
        ttl_s: int = 30 * 86_400,
        directory: DirectoryBlobs | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.redis = redis
        self.stored_bytes = stored_bytes or StoredBytes(redis)
        self.max_file_mb = max_file_mb
        self.max_bytes = int(max_file_mb * MB)
        self.ttl_s = ttl_s
        """How long a file without ``expires_after`` is kept."""
        self.in_redis = RedisBlobs(redis)
        self.directory = directory
        self.blobs: Blobs = directory or self.in_redis
        """Where new files' bytes go."""
        self.metrics = metrics
        # The indexes outlive every file they list.
        self._index_ttl_s = max(ttl_s, MAX_EXPIRES_S) + 3600

    # --- keys -------------------------------------------------------------------------

    @staticmethod
    def _key(owner: str, file_id: str) -> str:
        return f"{PREFIX}file:{{{owner}}}:rec:{file_id}"

    @staticmethod
    def _index(owner: str, purpose: str | None = None) -> str:
        suffix = "" if purpose is None else f":{purpose}"
        return f"{PREFIX}file:{{{owner}}}:index{suffix}"

    @staticmethod
    def _ends(owner: str) -> str:
        return f"{PREFIX}file:{{{owner}}}:ends"

    @staticmethod
    def _entry(file_id: str) -> str:
        """The file's name in the stored bytes."""
        return f"file:{file_id}"

    # --- create -----------------------------------------------------------------------

    @needs_store
    async def create(
        self,
        owner: str,
        purpose: str,
        filename: str,
        chunks: AsyncIterator[bytes],
        *,
        expires_after_s: int | None,
        quota: bool = True,
        file_id: str | None = None,
    ) -> dict[str, Any]:
        """Stores the file ``chunks`` make for the key ``owner`` and returns its file
        object. ``expires_after_s``: seconds from now until it expires (None: kept
        ``GATEWAY_FILES_TTL_DAYS``, ``expires_at`` null). With ``quota`` (an upload) it is
        refused past ``GATEWAY_MAX_FILE_MB`` (413 ``file_too_large``) or past the key's or
        project's quota (403 ``storage_quota_exceeded``), as soon as it passes either;
        without (a file the gateway makes: a batch's output) it is counted, never refused.
        Refused or failed (an error of ``chunks`` included), nothing of it is left.
        ``file_id`` (:func:`derived_file_id`): the file replaces the key's file of that id
        if there is one."""
        created_us = time.time_ns() // 1000  # the lists' order: when the upload began
        created_at = created_us // 1_000_000
        lifetime = self.ttl_s if expires_after_s is None else expires_after_s
        stored = StoredFile(
            owner=owner,
            id=file_id or new_file_id(),
            size=0,
            created_at=created_at,
            expires_at=None if expires_after_s is None else created_at + expires_after_s,
            ends_at=created_at + lifetime,
            filename=filename,
            purpose=purpose,
            blobs=self.blobs.kind,
        )
        entry = self._entry(stored.id)
        sink = self.blobs.sink(owner, stored.id, stored.ends_at)
        hold: Hold | None = None
        counted = False
        try:
            async for piece in _pieces(chunks):
                stored.size += len(piece)
                if quota:
                    self._bounded(stored.size)
                    hold = await self._hold(stored, entry)
                await sink.write(piece)
            if quota and hold is None:  # an empty file: its record
                hold = await self._hold(stored, entry)
            await sink.commit()
            raw = stored.model_dump_json()
            size = stored.size + len(raw) + INDEX_BYTES
            ttl_s = stored.ends_at - time.time()
            await self.stored_bytes.put(owner, entry, size, ttl_s, hold)
            hold, counted = None, True
            await self.stored_bytes.count_fleet(FILES, f"{owner}:{entry}", size, ttl_s)
            await self._write(stored, raw, created_us)
        except BaseException:
            await _cleaned(self._undo(stored, sink, hold, counted))
            raise
        if self.metrics is not None:
            self.metrics.files.labels(purpose, "created").inc()
        return stored.public()

    def _bounded(self, size: int) -> None:
        if size > self.max_bytes:
            raise PayloadTooLargeError(
                f"The file is larger than {self.max_file_mb:g} MB, the largest this gateway "
                "stores (GATEWAY_MAX_FILE_MB).",
                param="file",
                code="file_too_large",
            )

    async def _hold(self, stored: StoredFile, entry: str) -> Hold:
        """Holds the room the file takes so far (its hold grows with each piece)."""
        size = stored.size + len(stored.model_dump_json()) + INDEX_BYTES
        return await self.stored_bytes.hold(stored.owner, entry, size, "file", _INSTEAD)

    async def _write(self, stored: StoredFile, raw: str, created_us: int) -> None:
        """The record, with the file's expiry, and its index entries (scored by
        ``created_us``)."""
        owner, file_id = stored.owner, stored.id
        listed = {file_id: created_us}
        indexes = (self._index(owner), self._index(owner, stored.purpose), self._ends(owner))
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self._key(owner, file_id), raw, exat=stored.ends_at)
            pipe.zadd(indexes[0], listed)
            pipe.zadd(indexes[1], listed)
            pipe.zadd(indexes[2], {f"{stored.purpose}:{file_id}": stored.ends_at})
            for index in indexes:
                pipe.expire(index, self._index_ttl_s)
            await pipe.execute()

    async def _undo(
        self, stored: StoredFile, sink: BlobSink, hold: Hold | None, counted: bool
    ) -> None:
        """Removes what a failed create left: its bytes, its hold or its count."""
        await sink.abort()
        await self.stored_bytes.release(hold)
        if counted:  # the record may have been written too
            with contextlib.suppress(Exception):
                await self.redis.delete(self._key(stored.owner, stored.id))
            with contextlib.suppress(Exception):
                await self.stored_bytes.drop(stored.owner, self._entry(stored.id))
            with contextlib.suppress(Exception):
                entry = self._entry(stored.id)
                await self.stored_bytes.uncount_fleet(FILES, f"{stored.owner}:{entry}")

    # --- read -------------------------------------------------------------------------

    @needs_store
    async def _find(self, owner: str, file_id: str) -> StoredFile:
        """The caller's file, or a 404 (another key's included)."""
        if not _ID.fullmatch(file_id):
            raise not_found(file_id)
        raw = await self.redis.get(self._key(owner, file_id))
        if raw is None:
            raise not_found(file_id)
        return StoredFile.model_validate_json(raw)

    async def get(self, owner: str, file_id: str) -> dict[str, Any]:
        """The caller's file object, or a 404."""
        return (await self._find(owner, file_id)).public()

    async def chunks(self, owner: str, file_id: str) -> AsyncIterator[bytes]:
        """The caller's file's bytes, in pieces of at most 1 MiB (a 404 at the first step
        when there is no such file)."""
        stored = await self._find(owner, file_id)
        try:
            async for piece in self._blobs_of(stored).pieces(stored.ref()):
                yield piece
        except BlobMissing as exc:
            if not await self.redis.exists(self._key(owner, file_id)):
                raise not_found(file_id) from exc  # deleted, or expired, meanwhile
            raise FileStorageError(f"{file_id}: {exc}") from exc

    async def read(self, owner: str, file_id: str) -> bytes:
        """The caller's file's bytes, whole (a 404 when there is no such file)."""
        return b"".join([piece async for piece in self.chunks(owner, file_id)])

    def _blobs_of(self, stored: StoredFile) -> Blobs:
        if stored.blobs == "redis":
            return self.in_redis
        if self.directory is None:
            raise FileStorageError(
                f"{stored.id} was stored in GATEWAY_FILES_DIR, which is no longer set"
            )
        return self.directory

    # --- delete -----------------------------------------------------------------------

    @needs_store
    async def delete(self, owner: str, file_id: str) -> dict[str, Any]:
        """Deletes the caller's file (a 404 when there is none), its bytes and their count."""
        stored = await self._find(owner, file_id)
        if not await self.redis.delete(self._key(owner, file_id)):
            raise not_found(file_id)  # deleted by another request meanwhile
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(self._index(owner), file_id)
            pipe.zrem(self._index(owner, stored.purpose), file_id)
            pipe.zrem(self._ends(owner), f"{stored.purpose}:{file_id}")
            await pipe.execute()
        with contextlib.suppress(FileStorageError):  # a directory's blob ends at its sweep
            await self._blobs_of(stored).delete(stored.ref())
        await self.stored_bytes.drop(owner, self._entry(file_id))
        await self.stored_bytes.uncount_fleet(FILES, f"{owner}:{self._entry(file_id)}")
        if self.metrics is not None:
            self.metrics.files.labels(stored.purpose, "deleted").inc()
        return {"id": file_id, "object": "file", "deleted": True}

    # --- list -------------------------------------------------------------------------

    async def _trim(self, owner: str) -> None:
        """Removes expired files from the indexes."""
        ends = self._ends(owner)
        gone = await self.redis.zrangebyscore(ends, "-inf", f"({int(time.time())}", 0, TRIM_PER_RUN)
        if not gone:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(ends, *gone)
            for member in gone:
                purpose, _, file_id = str(member).rpartition(":")
                pipe.zrem(self._index(owner), file_id)
                pipe.zrem(self._index(owner, purpose), file_id)
            await pipe.execute()

    @needs_store
    async def list(
        self,
        owner: str,
        *,
        purpose: str | None,
        after: str | None,
        limit: int,
        order: str,
    ) -> tuple[list[dict[str, Any]], bool]:
        """A page of the caller's files (those of ``purpose``), by creation (``desc``:
        newest first), from the one after ``after`` (a 400 naming ``after`` when it is not
        one of them): their file objects, and whether more follow."""
        await self._trim(owner)
        index = self._index(owner, purpose)
        desc = order == "desc"
        bound = "+inf" if desc else "-inf"
        if after is not None:
            score = await self.redis.zscore(index, after)
            if score is None:
                raise InvalidRequestError(f"No file with id '{after}'.", param="after")
            bound = f"({int(score)}"
        found: list[StoredFile] = []
        while len(found) <= limit:
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
            raws = await self.redis.mget([self._key(owner, member) for member, _ in scored])
            found += [StoredFile.model_validate_json(raw) for raw in raws if raw]
            bound = f"({int(scored[-1][1])}"
            if len(scored) < SCAN_BATCH:
                break
        return [stored.public() for stored in found[:limit]], len(found) > limit


async def _pieces(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` cut (or joined) into pieces of :data:`CHUNK_BYTES`, the last one shorter."""
    pending = bytearray()
    async for chunk in chunks:
        if not pending and len(chunk) == CHUNK_BYTES:
            yield chunk
            continue
        pending += chunk
        while len(pending) >= CHUNK_BYTES:
            yield bytes(pending[:CHUNK_BYTES])
            del pending[:CHUNK_BYTES]
    if pending:
        yield bytes(pending)


async def _cleaned(cleanup: Awaitable[None]) -> None:
    """Runs ``cleanup`` to its end even when the request is being cancelled (its client
    left): in a task of its own, kept referenced until it finishes."""
    task = asyncio.ensure_future(cleanup)
    _CLEANING.add(task)
    task.add_done_callback(_CLEANING.discard)
    with contextlib.suppress(Exception):
        await asyncio.shield(task)
