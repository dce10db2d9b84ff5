"""How many bytes each API key (and each project) keeps stored in Redis, and the quotas
``GATEWAY_STORED_MB_PER_KEY`` and ``GATEWAY_STORED_MB_PER_PROJECT`` on them, beside the
global :class:`~gateway.state.headroom.Headroom`: one key filling its share cannot stop
another key's storing.

What counts: every record a key keeps for long, as the bytes of what is stored (its JSON or
text) plus :data:`RECORD_OVERHEAD` for what Redis keeps beside it: stored ``/v1/responses``
responses (with their conversation, the index entries of their items:
:mod:`gateway.state.item_index`, and a background response's event log), conversations,
stored chat completions, chat sessions, spoken answers' transcripts, Realtime client
secrets not yet used, and files (``/v1/files``, their bytes wherever they are kept:
:mod:`gateway.state.files`, which holds an upload's room piece by piece as it arrives).

**Accounting** (``lua/stored_bytes.lua``, one script run per scope, so a check and its
increment cannot interleave between replicas). Each scope keeps a sorted set of its entries
(a record, or a hold) scored by when they end, and a hash of their sizes with their sum.
Every run first removes the entries whose end has passed, so a record that expires by its
TTL stops counting without anything deleting it; one that is deleted or replaced releases
its bytes at once. A key's counters carry the key id as their Redis Cluster hash tag
(``gw:stored:{<id>}:...``, the key's slot), a project's the project id: each is its own
script run, as budgets are (:mod:`gateway.state.budgets`).

**When it is checked**: before anything is generated. A Responses request with ``store``
*holds* the size of its record as known then (everything but the answer) for
:data:`HOLD_S` at most, so concurrent requests see each other; past a quota it is refused
with 403 ``storage_quota_exceeded`` (the SDKs do not retry a 403) naming the setting and
the figures. A session is checked for room (its new turn is the prompt the key pays for).
The write once the answer is there is never refused for the quota: an answer the key paid
for is not thrown away, so a key may go past its quota by what its running requests
generate (tokens it pays for), and its next store is refused. Transcripts are counted, never
refused (they are the text of an answer already spoken).

**Order between the two scopes** errs towards counting too much, never too little: a hold
takes the key's room then the project's (given back if the project has none); a write
counts the project, then the key, then writes the record; a delete removes the record, then
its counts. A replica that dies in between leaves at most one record counted until its TTL.
A record written before this accounting existed is not counted (it expires by its TTL).
A key moved to another project keeps its records counted in the old one until they expire.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis

from gateway.errors import InvalidRequestError, PermissionDeniedError
from gateway.state.headroom import Headroom
from gateway.state.keys import public_record, record_key
from gateway.state.redis import PREFIX, needs_store
from gateway.state.scripts import register


def bounded_json(record: BaseModel, max_kb: int, param: str, told: str, advice: str) -> str:
    """``record`` as it is stored (its JSON), or a 400 ``stored_record_too_large`` naming
    ``param`` when it is larger than ``max_kb`` (``GATEWAY_MAX_STORED_KB``): ``told`` says
    what it is (``"this response is"``), ``advice`` what to send instead."""
    raw = record.model_dump_json()
    size = len(raw.encode())
    if size > max_kb * 1024:
        raise InvalidRequestError(
            f"{told} {size:,} bytes of JSON; the gateway stores at most {max_kb} KB of it "
            f"(GATEWAY_MAX_STORED_KB). {advice}",
            param=param,
            code="stored_record_too_large",
        )
    return raw


#: What Redis keeps beside a record's bytes (its key, its expiry, its accounting entries),
#: counted with each record so that many tiny records are not free: Redis's
#: ``used_memory`` grew by 550 bytes per 10-byte response record with its key's accounting
#: (220 without it), measured on Redis 7.
RECORD_OVERHEAD = 512
#: How long a hold lasts when the request that took it never settles it (its replica died):
#: longer than a generation takes. One that outlives it only lets concurrent requests see
#: less than is coming; the write counts the record all the same.
HOLD_S = 600
#: Ended entries one script run removes at most (about 1 ms of Redis's time), so that a
#: key idle while thousands of its records expired does not stall Redis for the others.
TRIM_PER_RUN = 1000
MB = 1024 * 1024
#: Releases under way, kept referenced until they finish (see :meth:`StoredBytes.release`).
_RELEASING: set[asyncio.Task[None]] = set()


def counter_keys(scope: str, name: str) -> list[str]:
    """The Redis keys of a key's (``scope`` "key"), a project's or every key's (``scope``
    "fleet", ``name`` a kind of record: :meth:`StoredBytes.count_fleet`) stored bytes: the
    ends of its entries and their sizes, in the slot of its id."""
    tag = {"key": f"{{{name}}}", "project": f"project:{{{name}}}", "fleet": f"fleet:{{{name}}}"}[
        scope
    ]
    return [f"{PREFIX}stored:{tag}:ends", f"{PREFIX}stored:{tag}:sizes"]


@dataclass(frozen=True, slots=True)
class Hold:
    """Room held for a record a request will store (see :meth:`StoredBytes.hold`)."""

    owner: str
    project: str | None
    entry: str
    size: int


class StoredBytes:
    """The stored bytes of keys and projects, and their quotas (0 MB: none; the bytes are
    counted all the same, for ``/v1/me``)."""

    def __init__(
        self,
        redis: Redis,
        per_key_mb: float = 0.0,
        per_project_mb: float = 0.0,
        headroom: Headroom | None = None,
    ) -> None:
        self.redis = redis
        self.per_key_mb, self.per_project_mb = per_key_mb, per_project_mb
        self.per_key = int(per_key_mb * MB)
        self.per_project = int(per_project_mb * MB)
        self.headroom = headroom or Headroom(redis)
        self._script = register(redis, "stored_bytes")

    async def _run(self, scope: str, name: str, op: str, *args: str | int) -> Any:
        keys = counter_keys(scope, name)
        while True:
            result = await self._script(keys=keys, args=[op, TRIM_PER_RUN, *args])
            if result != "more":  # ended entries left to remove first
                return result

    async def _project(self, owner: str) -> str | None:
        """The project of the key ``owner`` as its record says now (none for the bootstrap
        admin key, which has no record)."""
        raw = await self.redis.get(record_key(owner))
        return public_record(raw).project if raw else None

    @needs_store
    async def hold(self, owner: str, entry: str, size: int, param: str, instead: str) -> Hold:
        """Holds ``size`` bytes (plus the record's overhead) for the record ``entry`` the
        key ``owner`` will store, or checks that it has room at all (``size`` 0). Raises 503
        ``store_full`` when Redis has no room for stored records, 403
        ``storage_quota_exceeded`` past the key's or its project's quota, naming ``param``
        (``instead``: what the client may do instead, e.g. ``send store: false``)."""
        await self.headroom.check()
        size = size + RECORD_OVERHEAD if size else 0
        held = f"hold:{entry}"
        project = await self._project(owner)
        ms = int(HOLD_S * 1000)
        ok, used = await self._run("key", owner, "hold", held, size, ms, self.per_key)
        if not int(ok):
            raise _refused("This API key", "KEY", self.per_key_mb, used, size, param, instead)
        if project is not None:
            ours = f"{owner}:{held}"  # a project's entries are named by key
            ok, used = await self._run("project", project, "hold", ours, size, ms, self.per_project)
            if not int(ok):
                await self._run("key", owner, "drop", held)
                whose = f"The project '{project}'"
                raise _refused(whose, "PROJECT", self.per_project_mb, used, size, param, instead)
        return Hold(owner, project, held, size)

    @needs_store
    async def put(self, owner: str, entry: str, size: int, ttl_s: float, hold: Hold | None) -> None:
        """Counts the record ``entry`` of ``size`` bytes, kept ``ttl_s`` from now, in place
        of what it replaces and of ``hold``. Never refused: call it before writing the
        record, and :meth:`drop` it if the write fails."""
        size += RECORD_OVERHEAD
        ms = int(ttl_s * 1000)
        project = hold.project if hold is not None else await self._project(owner)
        held = hold.entry if hold is not None else ""
        if project is not None:
            await self._run(
                "project", project, "put", f"{owner}:{entry}", size, ms, held and f"{owner}:{held}"
            )
        await self._run("key", owner, "put", entry, size, ms, held)

    async def release(self, hold: Hold | None) -> None:
        """Gives a hold back (the request stores nothing), even when the request is being
        cancelled (its client left): the release runs in a task of its own. Best effort: a
        hold not given back ends by itself after :data:`HOLD_S`."""
        if hold is None:
            return
        task = asyncio.ensure_future(self._release(hold))
        _RELEASING.add(task)
        task.add_done_callback(_RELEASING.discard)
        await asyncio.shield(task)

    async def _release(self, hold: Hold) -> None:
        with contextlib.suppress(Exception):
            await self._drop(hold.owner, hold.project, hold.entry)

    @needs_store
    async def drop(self, owner: str, entry: str) -> None:
        """Stops counting the record ``entry`` (deleted, or never written)."""
        await self._drop(owner, await self._project(owner), entry)

    async def _drop(self, owner: str, project: str | None, entry: str) -> None:
        await self._run("key", owner, "drop", entry)
        if project is not None:
            await self._run("project", project, "drop", f"{owner}:{entry}")

    @needs_store
    async def count_fleet(self, kind: str, entry: str, size: int, ttl_s: float) -> None:
        """Counts the record ``entry`` among every key's records of ``kind`` (``files``),
        kept ``ttl_s`` from now: the fleet's figure a metric shows, no quota."""
        await self._run("fleet", kind, "put", entry, size, int(ttl_s * 1000), "")

    @needs_store
    async def uncount_fleet(self, kind: str, entry: str) -> None:
        """Stops counting ``entry`` among every key's records of ``kind`` (deleted)."""
        await self._run("fleet", kind, "drop", entry)

    @needs_store
    async def fleet_used(self, kind: str) -> int:
        """The bytes of every key's records of ``kind`` not yet ended."""
        return int(await self._run("fleet", kind, "read"))

    @needs_store
    async def usage(self, owner: str, project: str | None) -> dict[str, Any]:
        """``/v1/me``'s ``storage``: the bytes the key (and its project) keep stored, and
        their quotas (``null``: none)."""
        shown: dict[str, Any] = {
            "key": self._shown(await self._run("key", owner, "read"), self.per_key)
        }
        if project is not None:
            used = await self._run("project", project, "read")
            shown["project"] = {"id": project, **self._shown(used, self.per_project)}
        return shown

    @staticmethod
    def _shown(used: Any, quota: int) -> dict[str, int | None]:
        return {"used_bytes": int(used), "quota_bytes": quota or None}


def _refused(
    whose: str, scope: str, quota_mb: float, used: Any, size: int, param: str, instead: str
) -> PermissionDeniedError:
    return PermissionDeniedError(
        f"{whose} keeps {int(used):,} bytes of stored responses, files, sessions and transcripts; "
        f"its quota is {int(quota_mb * MB):,} (GATEWAY_STORED_MB_PER_{scope}={quota_mb:g} MB)"
        + (f", and this one needs {size:,} more" if size else "")
        + ". Delete stored responses (DELETE /v1/responses/{id}) or sessions "
        f"(DELETE /v1/sessions/{{id}}), wait for them to expire, or {instead}.",
        param=param,
        code="storage_quota_exceeded",
    )
