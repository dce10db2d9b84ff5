"""Where the bytes of uploaded files (``/v1/files``) live: :class:`RedisBlobs` (the default)
or :class:`DirectoryBlobs` (``GATEWAY_FILES_DIR``), behind one small interface, :class:`Blobs`,
that :class:`gateway.state.files.FileStore` writes, reads and deletes through; why there are
two is in that module's docstring. The records (name, size, purpose, owner) are in Redis
either way: a blob is only bytes, found by its :class:`BlobRef`.

A blob is written in pieces of at most :data:`CHUNK_BYTES` as they arrive (a
:class:`BlobSink`: ``write`` each piece, then ``commit``, or ``abort`` to leave nothing) and
read back in the same pieces, so neither an upload nor a download holds a whole file.

- **Redis**: each piece is a key of its own (``gw:file:{<key id>}:data:<file id>:<n>``, in
  the owner's Cluster slot as the record), set with the record's end (``PXAT``), so no
  command moves more than 1 MiB and the pieces expire with the record.
- **Directory**: one file per blob, ``<file id>.<end>`` (``<end>``: the Unix time it expires),
  written under a temporary name (``.<file id>.<end>.part``), flushed to disk and renamed, so
  a reader never sees half a file. Every call runs in a thread (``asyncio.to_thread``): a
  network volume may be slow, and the event loop serves everyone else meanwhile. A file
  cannot expire by itself as a Redis key does, so each process sweeps the directory at most
  every :data:`SWEEP_S`, when it writes: a blob whose end has passed is removed, and so is a
  temporary one left unchanged for :data:`ABANDONED_S` (its upload died with its replica).
  A failure of the directory is a 503 ``file_storage_unavailable``
  (:class:`gateway.errors.FileStorageError`), what the system said logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from redis.asyncio import Redis
from redis.client import NEVER_DECODE

from gateway.errors import FileStorageError
from gateway.state.redis import PREFIX, needs_store

#: The largest piece a blob is written and read in: no Redis command moves more.
CHUNK_BYTES = 1024 * 1024
#: How often one process sweeps expired blobs out of the directory (at most).
SWEEP_S = 600.0
#: A temporary file unchanged for this long belongs to an upload that died.
ABANDONED_S = 3600.0
#: Redis keys one ``DEL`` removes.
_DEL_BATCH = 256

BlobKind = Literal["redis", "directory"]
T = TypeVar("T")


class BlobMissing(Exception):
    """A piece of a blob is not there (deleted or expired meanwhile, or lost)."""


@dataclass(frozen=True, slots=True)
class BlobRef:
    """What finds a blob: its owner (the API key id), its file id, its size in bytes and
    when it expires (Unix seconds)."""

    owner: str
    file_id: str
    size: int
    ends_at: int

    @property
    def pieces(self) -> int:
        return -(-self.size // CHUNK_BYTES)


class BlobSink(Protocol):
    """A blob being written: ``write`` each piece (at most :data:`CHUNK_BYTES`), then
    ``commit``; ``abort`` removes what was written (it never raises)."""

    def write(self, piece: bytes) -> Awaitable[None]: ...

    async def commit(self) -> None: ...

    async def abort(self) -> None: ...


class Blobs(Protocol):
    """Where blobs are kept (see the module's docstring)."""

    kind: BlobKind

    def sink(self, owner: str, file_id: str, ends_at: int) -> BlobSink: ...

    def pieces(self, ref: BlobRef) -> AsyncIterator[bytes]:
        """The blob's bytes in pieces of at most :data:`CHUNK_BYTES`; raises
        :class:`BlobMissing` when one is not there."""
        ...

    def delete(self, ref: BlobRef) -> Awaitable[None]: ...


class RedisBlobs:
    """Blobs in Redis, a key per piece (see the module's docstring)."""

    kind: BlobKind = "redis"

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    @staticmethod
    def key(owner: str, file_id: str, index: int) -> str:
        return f"{PREFIX}file:{{{owner}}}:data:{file_id}:{index}"

    def sink(self, owner: str, file_id: str, ends_at: int) -> BlobSink:
        return _RedisSink(self, owner, file_id, ends_at)

    async def pieces(self, ref: BlobRef) -> AsyncIterator[bytes]:
        for index in range(ref.pieces):
            piece = await self._get(self.key(ref.owner, ref.file_id, index))
            if piece is None:
                raise BlobMissing(f"piece {index} of {ref.file_id}")
            yield piece

    @needs_store
    async def _get(self, key: str) -> bytes | None:
        # The client decodes answers as UTF-8 text (decode_responses): a piece is read as
        # the bytes it is, as redis-py reads DUMP's.
        get = self.redis.execute_command("GET", key, **{NEVER_DECODE: []})  # type: ignore[no-untyped-call]
        value = await get
        return None if value is None else bytes(value)

    @needs_store
    async def delete(self, ref: BlobRef) -> None:
        await self.remove(ref.owner, ref.file_id, ref.pieces)

    async def remove(self, owner: str, file_id: str, count: int) -> None:
        for start in range(0, count, _DEL_BATCH):
            end = min(start + _DEL_BATCH, count)
            await self.redis.delete(*(self.key(owner, file_id, i) for i in range(start, end)))


class _RedisSink:
    def __init__(self, blobs: RedisBlobs, owner: str, file_id: str, ends_at: int) -> None:
        self.blobs, self.owner, self.file_id = blobs, owner, file_id
        self.ends_at_ms = ends_at * 1000
        self.written = 0

    @needs_store
    async def write(self, piece: bytes) -> None:
        key = self.blobs.key(self.owner, self.file_id, self.written)
        self.written += 1  # counted first: an abort removes a piece whose write was cut off
        await self.blobs.redis.set(key, piece, pxat=self.ends_at_ms)

    async def commit(self) -> None:
        return None

    async def abort(self) -> None:
        with contextlib.suppress(Exception):  # the pieces expire with their end at worst
            await self.blobs.remove(self.owner, self.file_id, self.written)


class DirectoryBlobs:
    """Blobs as files of a directory every replica mounts (see the module's docstring)."""

    kind: BlobKind = "directory"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._next_sweep = 0.0

    def path(self, file_id: str, ends_at: int) -> Path:
        return self.root / f"{file_id}.{ends_at}"

    def sink(self, owner: str, file_id: str, ends_at: int) -> BlobSink:
        return _DirectorySink(self, file_id, ends_at)

    async def pieces(self, ref: BlobRef) -> AsyncIterator[bytes]:
        path = self.path(ref.file_id, ref.ends_at)
        for index in range(ref.pieces):
            yield await _io(_read_at, path, index * CHUNK_BYTES, CHUNK_BYTES)

    async def delete(self, ref: BlobRef) -> None:
        await _io(_unlink, self.path(ref.file_id, ref.ends_at))

    async def sweep(self) -> None:
        """Removes expired blobs and abandoned temporary files, at most every
        :data:`SWEEP_S` in this process (best effort: another replica may sweep too)."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_S
        with contextlib.suppress(OSError):
            await asyncio.to_thread(_sweep, self.root, time.time())


#: A blob's name in the directory, or its temporary name.
_NAME = re.compile(r"(\.)?file-[0-9a-f]+\.(\d+)(\.part)?")


def _sweep(root: Path, now: float) -> None:
    with os.scandir(root) as entries:
        for entry in entries:
            name = _NAME.fullmatch(entry.name)
            if name is None:
                continue
            ended = int(name.group(2)) < now
            with contextlib.suppress(OSError):
                if ended or (name.group(3) and entry.stat().st_mtime < now - ABANDONED_S):
                    os.unlink(entry.path)


class _DirectorySink:
    def __init__(self, blobs: DirectoryBlobs, file_id: str, ends_at: int) -> None:
        self.blobs = blobs
        self.final = blobs.path(file_id, ends_at)
        self.temporary = blobs.root / f".{file_id}.{ends_at}.part"
        self.handle: int | None = None

    async def write(self, piece: bytes) -> None:
        if self.handle is None:
            await self.blobs.sweep()
            self.handle = await _io(_create, self.temporary)
        await _io(_write_all, self.handle, piece)

    async def commit(self) -> None:
        if self.handle is None:  # an empty file
            self.handle = await _io(_create, self.temporary)
        handle, self.handle = self.handle, None
        await _io(_close_into, handle, self.temporary, self.final)

    async def abort(self) -> None:
        handle, self.handle = self.handle, None
        with contextlib.suppress(Exception):
            await asyncio.to_thread(_discard, handle, self.temporary)


async def _io(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` in a thread; a failure of the file system is a 503, a blob that is
    not there :class:`BlobMissing`."""
    try:
        return await asyncio.to_thread(call, *args)
    except FileNotFoundError as exc:
        raise BlobMissing(str(exc)) from exc
    except OSError as exc:
        raise FileStorageError(f"GATEWAY_FILES_DIR: {exc}") from exc


def _create(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)


def _write_all(handle: int, piece: bytes) -> None:
    view = memoryview(piece)
    while view:
        view = view[os.write(handle, view) :]


def _close_into(handle: int, temporary: Path, final: Path) -> None:
    """Flushes the temporary file to disk, closes it and gives it its final name."""
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
    os.replace(temporary, final)


def _discard(handle: int | None, temporary: Path) -> None:
    if handle is not None:
        with contextlib.suppress(OSError):
            os.close(handle)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)


def _read_at(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as file:
        file.seek(offset)
        return file.read(size)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
