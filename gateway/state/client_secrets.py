"""Realtime client secrets (``ek_...``): short-lived secrets that open one Realtime session
as the API key that created them, so a browser never holds the key.

A secret reads ``ek_<48 hex digits>`` (192 random bits) and, like a key, is stored only as
its SHA-256 hash: the record ``gw:client_secret:<hash>`` holds the id and hash of the key
that created it, the model and the session configuration as it was given, and expires with
the secret (``expires_after``, 10 s to 2 h). It is taken once: :meth:`ClientSecretStore.find`
reads it before the WebSocket is admitted, :meth:`ClientSecretStore.consume` deletes it
(``GETDEL``, atomic across replicas) so that of two connections presenting it, one gets
the session and the other a 401.

Bounded per key: a record is at most ``max_stored_kb`` KB of JSON (a 400 naming
``session`` past it) and counts, with its 512 bytes of overhead, in the creating key's
stored bytes (:mod:`gateway.state.stored_bytes`) until it is used or expires, so a key
past ``GATEWAY_STORED_MB_PER_KEY`` (or its project past its quota) is refused another with
403 ``storage_quota_exceeded``.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import Any, TypeGuard

from pydantic import BaseModel
from redis.asyncio import Redis

from gateway.errors import AuthenticationError
from gateway.state.keys import hash_key
from gateway.state.redis import PREFIX, needs_store
from gateway.state.stored_bytes import StoredBytes, bounded_json

#: What a client secret starts with (OpenAI's prefix).
CLIENT_SECRET_PREFIX = "ek_"

#: The 401 for a client secret presented anywhere but ``/v1/realtime``.
ONLY_REALTIME = (
    "A client secret (ek_...) only opens a Realtime session (the /v1/realtime WebSocket); "
    "send an API key for this request."
)


def is_client_secret(presented: str | None) -> TypeGuard[str]:
    return presented is not None and presented.startswith(CLIENT_SECRET_PREFIX)


def not_usable() -> AuthenticationError:
    return AuthenticationError(
        "This client secret is unknown, expired or already used: a client secret opens one "
        "Realtime session before its expires_at. Create another "
        "(POST /v1/realtime/client_secrets)."
    )


class ClientSecret(BaseModel):
    """A client secret's record: what the session it opens is, and whose."""

    owner: str
    """The id of the key that created it: the session is that key's request."""
    key_hash: str
    """The hash of that key (the record's own), so the session is admitted as that key
    as it is then: a key revoked, expired or replaced since refuses the secret."""
    model: str
    """The session's chat model, as the configuration resolved it."""
    session: dict[str, Any] | None
    """The session configuration as it was given (a ``session.update``'s session)."""
    expires_at: int


class ClientSecretStore:
    def __init__(self, redis: Redis, stored_bytes: StoredBytes, max_stored_kb: int) -> None:
        self.redis = redis
        self.stored_bytes = stored_bytes
        self.max_stored_kb = max_stored_kb

    @staticmethod
    def _key(digest: str) -> str:
        return f"{PREFIX}client_secret:{digest}"

    @staticmethod
    def _entry(digest: str) -> str:
        # The accounting's name for it: part of the hash, not the hash the record is under.
        return f"client_secret:{digest[:32]}"

    @needs_store
    async def create(
        self,
        owner: str,
        key: str,
        model: str,
        session: dict[str, Any] | None,
        ttl_s: int,
    ) -> tuple[str, ClientSecret]:
        """A new secret of the key ``key`` (as presented; only its hash is kept) of id
        ``owner``, and its record, kept ``ttl_s`` seconds: a 400 naming ``session`` when the
        record is larger than ``max_stored_kb``, 403 ``storage_quota_exceeded`` when the
        key (or its project) has no room for it, 503 ``store_full`` when Redis has none."""
        value = f"{CLIENT_SECRET_PREFIX}{secrets.token_hex(24)}"
        record = ClientSecret(
            owner=owner,
            key_hash=hash_key(key),
            model=model,
            session=session,
            expires_at=int(time.time()) + ttl_s,
        )
        raw = bounded_json(
            record,
            self.max_stored_kb,
            "session",
            "With its session configuration, this client secret is",
            "Send shorter instructions.",
        )
        digest = hash_key(value)
        entry, size = self._entry(digest), len(raw.encode())
        held = await self.stored_bytes.hold(
            owner, entry, size, "session", "let unused client secrets expire"
        )
        await self.stored_bytes.put(owner, entry, size, ttl_s, held)
        try:
            await self.redis.set(self._key(digest), raw, ex=ttl_s)
        except BaseException:
            with contextlib.suppress(Exception):  # counted until its TTL at worst
                await self.stored_bytes.drop(owner, entry)
            raise
        return value, record

    @needs_store
    async def find(self, value: str) -> ClientSecret:
        """The secret's record, left in place; 401 when it is unknown, expired or used."""
        raw = await self.redis.get(self._key(hash_key(value)))
        if raw is None:
            raise not_usable()
        return ClientSecret.model_validate_json(raw)

    @needs_store
    async def consume(self, value: str) -> None:
        """Uses the secret up (it opens one session) and gives back its stored bytes; 401
        when another connection took it first (or it expired meanwhile)."""
        digest = hash_key(value)
        raw = await self.redis.getdel(self._key(digest))
        if raw is None:
            raise not_usable()
        owner = ClientSecret.model_validate_json(raw).owner
        with contextlib.suppress(Exception):  # else counted until its TTL
            await self.stored_bytes.drop(owner, self._entry(digest))
