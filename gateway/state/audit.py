"""The admin audit log: who did what, when and from where, in one Redis stream
(``gw:audit``), read back by ``GET /admin/audit``.

Each admin action leaves two entries, as Kubernetes' audit log does (its RequestReceived
and ResponseComplete stages):

- ``requested``, written **before** the action runs. When it cannot be written (Redis down
  or full) the action is refused with that 503 and does not run: an action the log cannot
  hold does not happen. Admin actions are rare and an operator can retry, whereas a key
  created or revoked with no record is what an audit log exists to rule out (and key
  changes need that Redis anyway). The one exception is the bootstrap
  ``GATEWAY_ADMIN_KEY``, which exists to load and unload models while Redis is down: its
  action goes ahead and its entry is written to the process log (a warning) instead.
- ``completed`` or ``failed`` (with the error's code and status), written after it, naming
  what it made (a new key's id). A failure to write this one is only logged: the action is
  done and its ``requested`` entry stands.

Both carry the same ``request_id`` (nginx's ``X-Request-ID``, also in its access log). Who
is the admin key's id and name (``admin`` / ``GATEWAY_ADMIN_KEY`` for the bootstrap key,
``cli`` for ``gateway keys``), never a secret; from where is the client's address as the
server saw it (uvicorn takes it from ``X-Forwarded-For`` only from the proxies
``FORWARDED_ALLOW_IPS`` trusts, nginx on loopback by default).

Retention: each write trims the stream to ``audit_max_entries`` (approximately, Redis's
``MAXLEN ~``) and drops entries older than ``audit_retention_days`` (``MINID``, exact);
reads never return an entry past its age, written or not since.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel
from redis.asyncio import Redis

from gateway.errors import GatewayError, InvalidRequestError, StoreUnavailableError
from gateway.state.admission import BOOTSTRAP_ADMIN
from gateway.state.redis import PREFIX, needs_store

logger = logging.getLogger("gateway.audit")

STREAM = f"{PREFIX}audit"
#: The most entries one ``GET /admin/audit`` returns.
MAX_PAGE = 1000
_ENTRY_ID = re.compile(r"\d{1,20}-\d{1,20}")

Stage = Literal["requested", "completed", "failed"]


class Actor(BaseModel):
    """Who: an admin key's public id and name (never the key)."""

    id: str
    name: str


class AuditEntry(BaseModel):
    """One entry of the audit log, as ``GET /admin/audit`` shows it."""

    object: Literal["audit_entry"] = "audit_entry"
    id: str
    """The stream entry's id (``<unix ms>-<n>``): the ``after`` cursor of the next page."""
    time: float
    """Unix time, in seconds."""
    actor: Actor
    action: str
    """What: ``key.create``, ``key.revoke``, ``model.load``, ``model.unload``..."""
    target: str | None = None
    """What it acted on: a key id, a model name."""
    stage: Stage
    client: str | None = None
    """From where: the client's address."""
    request_id: str | None = None
    details: dict[str, Any] = {}
    """What the request asked for (a new key's name, role and limits), or, for a failed
    action, the error's ``code`` and ``status``."""


class AuditLog:
    def __init__(self, redis: Redis, retention_days: float, max_entries: int) -> None:
        self.redis = redis
        self.retention_s = retention_days * 86_400
        self.max_entries = max_entries

    def _oldest_kept(self, now: float) -> str:
        return f"{max(0, int((now - self.retention_s) * 1000))}-0"

    @needs_store
    async def append(
        self,
        actor: Actor,
        action: str,
        stage: Stage,
        *,
        target: str | None = None,
        client: str | None = None,
        request_id: str | None = None,
        details: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> str:
        """Writes one entry and trims the stream; returns the entry's id. Raises
        :class:`~gateway.errors.StoreUnavailableError` or ``StoreFullError`` (503) when it
        cannot be written."""
        entry = {
            "actor": actor.model_dump(),
            "action": action,
            "target": target,
            "stage": stage,
            "client": client,
            "request_id": request_id,
            "details": details or {},
        }
        oldest = self._oldest_kept(now or time.time())
        # One round trip (on the one key: one node of a Cluster).
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(STREAM, {"e": json.dumps(entry)}, maxlen=self.max_entries, approximate=True)
            pipe.xtrim(STREAM, minid=oldest, approximate=False)
            entry_id, _ = await pipe.execute()
        return str(entry_id)

    @needs_store
    async def page(
        self, limit: int = 100, after: str | None = None, now: float | None = None
    ) -> tuple[list[AuditEntry], bool]:
        """Entries newest first: up to ``limit`` (at most :data:`MAX_PAGE`, checked by the
        route) older than the entry ``after`` (or the newest), and whether there are more."""
        if after is not None and (
            not _ENTRY_ID.fullmatch(after) or max(map(int, after.split("-"))) >= 2**64
        ):
            raise InvalidRequestError(
                "after must be the id of an audit entry (such as 1732435200000-0).",
                param="after",
                code="invalid_cursor",
            )
        if after is not None and not any(map(int, after.split("-"))):
            return [], False  # 0-0: nothing is older than the first id there can be
        newest = f"({after}" if after is not None else "+"
        raw: list[tuple[str, dict[str, str]]] = await self.redis.xrevrange(  # type: ignore[assignment]
            STREAM, max=newest, min=self._oldest_kept(now or time.time()), count=limit + 1
        )
        entries = [_entry(entry_id, fields) for entry_id, fields in raw[:limit]]
        return entries, len(raw) > limit


@dataclass
class Action:
    """The action being recorded: what its ``completed`` entry will say."""

    target: str | None
    details: dict[str, Any] = field(default_factory=dict)


class Auditor:
    """Records the actions of one admin request (who and from where are bound)."""

    def __init__(
        self,
        log: AuditLog,
        actor: Actor,
        client: str | None,
        request_id: str | None,
        done_only: bool = False,
    ) -> None:
        self.log = log
        self.actor = actor
        self.client = client
        self.request_id = request_id
        self.done_only = done_only
        """Only actions that were done are written (any key's own, a batch made or
        cancelled: a key cannot fill the log with refusals, nor hold its action on it)."""

    @asynccontextmanager
    async def __call__(
        self, action: str, target: str | None = None, details: dict[str, Any] | None = None
    ) -> AsyncIterator[Action]:
        """Records ``action`` on ``target`` (``details``: what was asked) around the block."""
        if self.done_only:
            done = Action(target, dict(details or {}))
            yield done
            await self._after(action, "completed", done.target, done.details)
            return
        try:
            await self._append(action, "requested", target, details or {})
        except StoreUnavailableError as exc:
            if self.actor.id != BOOTSTRAP_ADMIN.id:
                raise  # nothing runs
            # GATEWAY_ADMIN_KEY exists to manage models while Redis is down: its action
            # goes ahead, recorded in the process log instead.
            logger.warning(
                "audit log: Redis cannot hold %s %s by %s from %s (request %s): %s; "
                "recorded here only",
                action,
                target,
                self.actor.id,
                self.client,
                self.request_id,
                exc,
            )
        done = Action(target)
        try:
            yield done
        except (Exception, asyncio.CancelledError) as exc:
            failure = {
                "status": getattr(exc, "status_code", 500),
                "code": exc.code if isinstance(exc, GatewayError) else None,
            }
            if isinstance(exc, asyncio.CancelledError):
                failure = {"status": None, "code": "cancelled"}
            await self._after(action, "failed", done.target, {**done.details, **failure})
            raise
        await self._after(action, "completed", done.target, done.details)

    async def _append(
        self, action: str, stage: Stage, target: str | None, details: dict[str, Any]
    ) -> None:
        await self.log.append(
            self.actor,
            action,
            stage,
            target=target,
            client=self.client,
            request_id=self.request_id,
            details=details,
        )

    async def _after(
        self, action: str, stage: Stage, target: str | None, details: dict[str, Any]
    ) -> None:
        """The outcome's entry; the action is done, so a failure here is only logged."""
        try:
            await self._append(action, stage, target, details)
        except Exception as exc:
            logger.error(
                "audit log: could not record %s %s %s by %s (request %s): %s",
                action,
                target,
                stage,
                self.actor.id,
                self.request_id,
                exc,
            )


def _entry(entry_id: str, fields: dict[str, str]) -> AuditEntry:
    stored = json.loads(fields["e"])
    return AuditEntry(id=entry_id, time=int(entry_id.split("-")[0]) / 1000, **stored)
