"""API keys' records: created at random, shown once, stored in Redis only as a SHA-256 hash
with their metadata; listed, read and revoked by the admin API.

A key reads ``sk-gw-<id>-<secret>``. The public ``id`` (12 hex digits) names the record
(``gw:key:{<id>}``), so the check of a presented key reads one record
(:mod:`gateway.state.admission`, which checks and admits keys). Keys carry 256 random bits,
so a fast hash is the right one (a slow password hash protects guessable secrets, which
these are not).
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from redis.asyncio import Redis

from gateway.errors import InvalidRequestError, NotFoundError, PermissionDeniedError
from gateway.state.redis import PREFIX, needs_store

KEY_PREFIX = "sk-gw-"
_INDEX = f"{PREFIX}keys"

Role = Literal["user", "admin"]


def record_key(key_id: str) -> str:
    # The id in braces is the Redis Cluster hash tag: a key's record, rate-limit windows
    # and usage live in one slot, so one Lua script may read and write them all.
    return f"{PREFIX}key:{{{key_id}}}"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def generate_key() -> tuple[str, str]:
    """A new ``(id, key)``."""
    key_id = secrets.token_hex(6)
    return key_id, f"{KEY_PREFIX}{key_id}-{secrets.token_urlsafe(32)}"


class KeyLimits(BaseModel):
    """Per-key limits; ``None`` means unlimited."""

    rpm: int | None = Field(None, ge=1, description="Requests per minute.")
    tpm: int | None = Field(None, ge=1, description="Tokens (prompt + completion) per minute.")
    max_concurrency: int | None = Field(None, ge=1, description="Requests running at once.")
    priority: int | None = Field(
        None,
        ge=-100,
        le=100,
        description="Scheduling priority of the key's requests, lower first (vLLM's "
        "polarity); also the lowest value a request of the key may ask for in its own "
        "`priority`. Null: 0.",
    )


#: A project's id: its name in the admin API and the Redis Cluster hash tag of its records.
PROJECT_ID = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
#: The largest money budget (the price table's unit): spend is counted in billionths of it,
#: exactly, in Lua's numbers (doubles, exact up to 2^53).
MAX_COST_BUDGET = 1_000_000


class Budget(BaseModel):
    """Budgets of a key or a project (docs/budgets.md): tokens (prompt + completion) or
    money (at the prices of ``GATEWAY_PRICES``) per calendar day or month in UTC; ``None``
    means none. Reached, the key's (or the project's keys') requests are refused with 429
    ``budget_exceeded`` until the period resets (``budget_held`` while only what running
    requests reserved is in the way)."""

    model_config = ConfigDict(extra="forbid")

    tokens_per_day: int | None = Field(None, ge=1, le=10**15)
    tokens_per_month: int | None = Field(None, ge=1, le=10**15)
    cost_per_day: float | None = Field(None, gt=0, le=MAX_COST_BUDGET)
    cost_per_month: float | None = Field(None, gt=0, le=MAX_COST_BUDGET)

    def empty(self) -> bool:
        return not (
            self.tokens_per_day or self.tokens_per_month or self.cost_per_day or self.cost_per_month
        )


def budget_or_none(budget: Budget | None) -> Budget | None:
    """``budget`` as stored: None when it sets no budget at all."""
    return None if budget is None or budget.empty() else budget


class KeyCreate(KeyLimits):
    """Body of ``POST /admin/keys`` (a field it does not declare is a 400 naming it: a
    misspelt limit must not leave a key unlimited)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100)
    role: Role = "user"
    models: list[str] | None = Field(
        None, description="Models the key may use; null or absent: every model."
    )
    expires_at: int | None = Field(None, description="Unix time the key stops working.")
    expires_in_days: float | None = Field(None, gt=0, description="Or: days from now.")
    project: str | None = Field(
        None, pattern=PROJECT_ID, description="The project the key belongs to (it must exist)."
    )
    budget: Budget | None = Field(None, description="The key's own budgets.")

    @model_validator(mode="after")
    def _one_expiry(self) -> KeyCreate:
        if self.expires_at is not None and self.expires_in_days is not None:
            raise ValueError("give expires_at or expires_in_days, not both")
        return self


class ApiKey(KeyLimits):
    """A key's metadata, as the admin API shows it (never the key or its hash)."""

    object: Literal["api_key"] = "api_key"
    id: str
    name: str
    role: Role
    models: list[str] | None = None
    created_at: int
    expires_at: int | None = None
    revoked_at: int | None = None
    redacted_value: str = ""
    project: str | None = None
    budget: Budget | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    def require_model(self, model: str, param: str = "model", use: str | None = None) -> None:
        """403 unless this key may use ``model``. ``use``: what the model does for the
        request, when the gateway chose it (a model used implicitly is checked like the one
        a request names)."""
        if not self.may_use(model):
            which = f", which {use}" if use else ""
            raise PermissionDeniedError(
                f"This API key may not use the model '{model}'{which}.",
                param=param,
                code="model_not_allowed",
            )

    def request_priority(self, requested: int | None) -> int:
        """The priority a request runs at: the one it asks for (vLLM's ``priority``), which
        may not come before the key's own (a 400 naming it), else the key's."""
        own = self.priority or 0
        if requested is None:
            return own
        if requested < own:
            raise InvalidRequestError(
                f"priority {requested} is not allowed for this API key: its requests run at "
                f"priority {own} or later (a larger number; lower goes first).",
                param="priority",
                code="priority_not_allowed",
            )
        return requested


class KeyUpdate(BaseModel):
    """Body of ``PATCH /admin/keys/{id}``: the fields given are set (``null`` clears one),
    the others stay."""

    model_config = ConfigDict(extra="forbid")

    project: str | None = Field(None, pattern=PROJECT_ID)
    budget: Budget | None = None
    priority: int | None = Field(None, ge=-100, le=100)
    """As :attr:`KeyLimits.priority`; ``null``: 0."""


class _StoredKey(ApiKey):
    secret_hash: str


class CreatedKey(ApiKey):
    """The answer to creating a key: the only time ``key`` is shown."""

    key: str


class KeyStore:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    @needs_store
    async def create(self, spec: KeyCreate, now: float | None = None) -> CreatedKey:
        created = int(now or time.time())
        expires = spec.expires_at
        if spec.expires_in_days is not None:
            expires = created + int(spec.expires_in_days * 86_400)
        key_id, key = generate_key()
        stored = _StoredKey(
            id=key_id,
            name=spec.name,
            role=spec.role,
            models=spec.models,
            rpm=spec.rpm,
            tpm=spec.tpm,
            max_concurrency=spec.max_concurrency,
            priority=spec.priority,
            created_at=created,
            expires_at=expires,
            project=spec.project,
            budget=budget_or_none(spec.budget),
            redacted_value=f"{KEY_PREFIX}{key_id}-****",
            secret_hash=hash_key(key),
        )
        # Not a transaction: the index and the record are in different slots of a Redis
        # Cluster. Indexed first, so a key that exists is always listed (an id whose
        # record is missing is skipped by `all`).
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.sadd(_INDEX, key_id)
            pipe.set(record_key(key_id), stored.model_dump_json())
            await pipe.execute()
        return CreatedKey(**_public(stored).model_dump(), key=key)

    @needs_store
    async def _load(self, key_id: str) -> _StoredKey | None:
        raw = await self.redis.get(record_key(key_id))
        return _StoredKey.model_validate_json(raw) if raw else None

    async def _existing(self, key_id: str) -> _StoredKey:
        stored = await self._load(key_id)
        if stored is None:
            raise NotFoundError(f"No API key with id '{key_id}'.", code="key_not_found")
        return stored

    async def get(self, key_id: str) -> ApiKey:
        return _public(await self._existing(key_id))

    @needs_store
    async def all(self) -> list[ApiKey]:
        ids = sorted(str(i) for i in await self.redis.smembers(_INDEX))
        # One GET per key in a pipeline (an MGET would span slots in a Redis Cluster).
        async with self.redis.pipeline(transaction=False) as pipe:
            for key_id in ids:
                pipe.get(record_key(key_id))
            raws = await pipe.execute() if ids else []
        keys = [_public(_StoredKey.model_validate_json(r)) for r in raws if r]
        return sorted(keys, key=lambda k: (k.created_at, k.id))

    @needs_store
    async def revoke(self, key_id: str, now: float | None = None) -> ApiKey:
        """Marks the key revoked (idempotent); the record stays, for its usage history."""
        stored = await self._existing(key_id)
        if stored.revoked_at is None:
            stored.revoked_at = int(now or time.time())
            await self.redis.set(record_key(key_id), stored.model_dump_json())
        return _public(stored)

    @needs_store
    async def update(self, key_id: str, change: KeyUpdate) -> ApiKey:
        """Sets the fields ``change`` gives (its project must exist: the caller checks)."""
        stored = await self._existing(key_id)
        given = change.model_fields_set
        if "project" in given:
            stored.project = change.project
        if "budget" in given:
            stored.budget = budget_or_none(change.budget)
        if "priority" in given:
            stored.priority = change.priority
        await self.redis.set(record_key(key_id), stored.model_dump_json())
        return _public(stored)


# A record is read from Redis on every request (a revocation takes effect at once on every
# replica); only the parsing of a record already seen is remembered. The parsed keys are
# shared between requests and never modified.
@functools.lru_cache(maxsize=4096)
def public_record(raw: str) -> ApiKey:
    """A key's metadata from its stored record (read to check a presented key)."""
    return _public(_StoredKey.model_validate_json(raw))


def _public(stored: _StoredKey) -> ApiKey:
    return ApiKey(**stored.model_dump(exclude={"secret_hash"}))
