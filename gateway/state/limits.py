"""Per-key rate limits (requests per minute, tokens per minute, concurrent requests) and
usage, enforced atomically in Redis so that any number of gateway processes together never
exceed a limit.

Each limit is one Lua script run (``EVALSHA``): Redis runs scripts one at a time, so the
check and the increment cannot interleave between replicas, and the clock is Redis's own
``TIME``, the same for every replica.

- Requests and tokens are counted in one-second buckets (a hash: second -> amount); the
  window is the last 60 seconds, so the limit holds over every sliding minute. A request is
  admitted while the window's requests are under ``rpm`` and its tokens under ``tpm``.
- Tokens are reserved before generation starts, as OpenAI admits them: the prompt
  (estimated) plus ``n x max_tokens`` must fit what the window has left, else a 429. A
  request that set no ``max_tokens`` is given what is left (at most its default), so it can
  never generate past the limit. When it ends, the reservation is settled to the real count
  in the bucket it was taken from. Embeddings reserve their inputs (estimated); audio,
  which cannot be sized beforehand, is counted when it ends.
- Concurrency is a sorted set of leases scored by expiry. A running request renews its lease;
  a gateway that dies without releasing its leases frees them when they expire
  (``concurrency_lease_s``).

The headers OpenAI sends (``x-ratelimit-limit-requests`` ... ``-tokens``) go on every
response of a key that has these limits.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.errors import AuthenticationError, RateLimitError
from gateway.state.keys import (
    EXPIRED,
    INCORRECT,
    REVOKED,
    ApiKey,
    KeyStore,
    checked,
    hash_key,
    key_id_of,
    no_key,
    record_key,
)
from gateway.state.redis import PREFIX, is_cluster, needs_store

logger = logging.getLogger("gateway.state.limits")

_WINDOW_S = 60

# The key check and the admission in one round trip.
# KEYS: key record, request buckets, token buckets, leases. ARGV: the presented key's hash,
# lease id ('' to take none), lease seconds. Returns {record or '', refusal of the key (''
# when valid)} when the key is refused or has no limits; else {record, '', admitted (1/0),
# limit hit, seconds until it frees, requests in the window (this one included), tokens in
# the window, seconds until the windows are empty again}; numbers as strings (Lua numbers
# reach Redis as integers). The hashes are compared in Lua: they are hashes of 256-bit
# secrets, so how long a comparison takes tells an attacker nothing usable.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local sec = tonumber(t[1])
local raw = redis.call('GET', KEYS[1])
if not raw then return {'', 'unknown'} end
local key = cjson.decode(raw)
if key.secret_hash ~= ARGV[1] then return {'', 'unknown'} end
if key.revoked_at ~= cjson.null then return {raw, 'revoked'} end
if key.expires_at ~= cjson.null and sec >= key.expires_at then return {raw, 'expired'} end
local function limit(value)
  if value == nil or value == cjson.null then return 0 end
  return value
end
local rpm, tpm, conc = limit(key.rpm), limit(key.tpm), limit(key.max_concurrency)
if rpm == 0 and tpm == 0 and conc == 0 then return {raw, ''} end
local function window(key)
  local total, oldest, newest = 0, sec, 0
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local s = tonumber(all[i])
    if s <= sec - 60 then
      redis.call('HDEL', key, all[i])
    else
      total = total + tonumber(all[i + 1])
      if s < oldest then oldest = s end
      if s > newest then newest = s end
    end
  end
  return total, oldest + 60 - now, newest + 60 - now
end
local requests, req_frees, req_empty = window(KEYS[2])
local tokens, tok_frees, tok_empty = window(KEYS[3])
local function no(limit, wait)
  return {raw, '', 0, limit, tostring(wait), tostring(requests), tostring(tokens),
          tostring(req_empty), tostring(tok_empty)}
end
if rpm > 0 and requests >= rpm then return no('requests', req_frees) end
if tpm > 0 and tokens >= tpm then return no('tokens', tok_frees) end
if conc > 0 and ARGV[2] ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  if redis.call('ZCARD', KEYS[4]) >= conc then return no('concurrency', 1) end
  local ttl = tonumber(ARGV[3])
  redis.call('ZADD', KEYS[4], now + ttl, ARGV[2])
  redis.call('EXPIRE', KEYS[4], math.ceil(ttl) + 1)
end
redis.call('HINCRBY', KEYS[2], sec, 1)
redis.call('EXPIRE', KEYS[2], 61)
return {raw, '', 1, '', '0', tostring(requests + 1), tostring(tokens), '60',
        tostring(tok_empty)}
"""

# KEYS: token buckets. ARGV: tpm, prompt tokens, tokens per generation, generations,
# flexible (1: the request set no max_tokens, so it may be given fewer). Returns {'ok',
# tokens granted per generation, bucket (second) of the reservation} or {'no', seconds
# until the window frees} or {'too_large'} (the request can never fit the limit).
_RESERVE = """
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec + tonumber(t[2]) / 1000000
local total, oldest = 0, sec
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local s = tonumber(all[i])
  if s <= sec - 60 then
    redis.call('HDEL', KEYS[1], all[i])
  else
    total = total + tonumber(all[i + 1])
    if s < oldest then oldest = s end
  end
end
local tpm, prompt, per, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4])
local least = per
if ARGV[5] == '1' then least = 1 end
if prompt + count * least > tpm then return {'too_large'} end
local grant = per
if ARGV[5] == '1' then grant = math.min(per, math.floor((tpm - total - prompt) / count)) end
if grant < least or prompt + count * grant > tpm - total then
  return {'no', tostring(oldest + 60 - now)}
end
redis.call('HINCRBY', KEYS[1], sec, prompt + count * grant)
redis.call('EXPIRE', KEYS[1], 61)
return {'ok', tostring(grant), tostring(sec)}
"""

# KEYS: token buckets, leases, usage. ARGV: tokens, lease id, prompt tokens, completion
# tokens, audio seconds in, audio seconds out, then the reservations as bucket, tokens
# pairs. The tokens used fill the reservations in turn; each reservation still in the
# window is settled to its share in its own bucket (never below zero), one that has left
# the window counts no more; tokens beyond all reservations are counted now.
_FINISH = """
local sec = tonumber(redis.call('TIME')[1])
local left = tonumber(ARGV[1])
for i = 7, #ARGV, 2 do
  local at, reserved = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local share = math.min(left, reserved)
  left = left - share
  if at > sec - 60 and share < reserved then
    local held = tonumber(redis.call('HGET', KEYS[1], at) or '0')
    local change = math.max(share - reserved, -held)
    if change ~= 0 then redis.call('HINCRBY', KEYS[1], at, change) end
  end
end
if left > 0 then
  redis.call('HINCRBY', KEYS[1], sec, left)
  redis.call('EXPIRE', KEYS[1], 61)
end
if ARGV[2] ~= '' then redis.call('ZREM', KEYS[2], ARGV[2]) end
redis.call('HINCRBY', KEYS[3], 'requests', 1)
redis.call('HINCRBY', KEYS[3], 'prompt_tokens', ARGV[3])
redis.call('HINCRBY', KEYS[3], 'completion_tokens', ARGV[4])
redis.call('HINCRBYFLOAT', KEYS[3], 'audio_seconds_in', ARGV[5])
redis.call('HINCRBYFLOAT', KEYS[3], 'audio_seconds_out', ARGV[6])
return 1
"""

# KEYS: leases. ARGV: lease id, lease seconds. Pushes the lease's expiry (and the set's)
# forward if it is still held.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
-- The set itself must outlive the renewed lease (every lease has the same length).
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 1)
end
return 1
"""


_KEY_REFUSALS = {"unknown": INCORRECT, "revoked": REVOKED, "expired": EXPIRED}


def _keys(key_id: str) -> tuple[str, str, str]:
    base = f"{PREFIX}rl:{{{key_id}}}"  # the key record's hash tag: one Cluster slot
    return f"{base}:requests", f"{base}:tokens", f"{base}:leases"


def usage_key(key_id: str) -> str:
    return f"{PREFIX}usage:{{{key_id}}}"


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``0s``, ``17s``, ``1m0s``."""
    whole = max(0, math.ceil(seconds))
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


#: Reserves tokens under a key's ``tpm`` (see :meth:`Meter.reserve`).
Reserver = Callable[["Meter", int, int, int, bool], Awaitable[int]]


@dataclass
class Meter:
    """What one request used. The services fill it in as they learn it; it is recorded
    when the response has been sent."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    audio_seconds_in: float = 0.0
    audio_seconds_out: float = 0.0
    reservations: list[tuple[int, int]] = field(default_factory=list)
    """Tokens reserved under the key's ``tpm`` before generating, as (window bucket,
    tokens): settled to what was used at the end."""
    reserver: Reserver | None = field(default=None, repr=False)
    """Set when the key has a ``tpm`` limit."""

    def add_tokens(self, prompt: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion

    async def reserve(
        self, prompt: int, per_generation: int, generations: int, flexible: bool
    ) -> int:
        """Reserves ``prompt + generations x per_generation`` tokens under the key's
        ``tpm`` before generating: a 429 when they do not fit what the window has left.
        ``flexible`` (the client set no ``max_tokens``): fewer tokens per generation may be
        granted, as many as fit. Returns the tokens granted per generation."""
        if self.reserver is None:
            return per_generation
        return await self.reserver(self, prompt, per_generation, generations, flexible)


@dataclass
class Admission:
    """A request let in: its headers, its meter, and the concurrency lease it holds."""

    key: ApiKey
    headers: dict[str, str]
    meter: Meter = field(default_factory=Meter)
    lease: str = ""
    model: str = ""
    """The model the request uses (for metrics), once :meth:`use_model` allowed it."""

    def use_model(self, model: str) -> Meter:
        """403 unless the key may use ``model``; returns the meter for the service."""
        self.key.require_model(model)
        self.model = model
        return self.meter


def _headers(key: ApiKey, result: list[str]) -> dict[str, str]:
    """The rate-limit headers from the admission script's counts (``result[3:]``)."""
    requests, tokens = int(result[3]), int(result[4])
    headers = {}
    if key.rpm is not None:
        headers["x-ratelimit-limit-requests"] = str(key.rpm)
        headers["x-ratelimit-remaining-requests"] = str(max(0, key.rpm - requests))
        headers["x-ratelimit-reset-requests"] = duration(float(result[5]))
    if key.tpm is not None:
        headers["x-ratelimit-limit-tokens"] = str(key.tpm)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, key.tpm - tokens))
        headers["x-ratelimit-reset-tokens"] = duration(float(result[6]) if tokens else 0)
    return headers


class RateLimiter:
    def __init__(self, redis: Redis, lease_s: float) -> None:
        self.redis = redis
        self.lease_s = lease_s
        self._admit = redis.register_script(_ADMIT)
        self._finish = redis.register_script(_FINISH)
        self._reserve = redis.register_script(_RESERVE)
        self._renew = redis.register_script(_RENEW)
        # Lease ids: this process's random prefix and a counter (unique across replicas).
        self._lease_prefix = f"{uuid.uuid4().hex[:12]}-"
        self._lease_numbers = itertools.count()
        self._held: dict[str, str] = {}  # lease id -> its lease set, while the request runs
        self._renewer: asyncio.Task[None] | None = None

    @needs_store
    async def admit(
        self, keys: KeyStore, presented: str | None, hold_lease: bool = True
    ) -> Admission:
        """Checks the presented key and lets its request in, in one Redis round trip: 401
        for a missing, unknown, revoked or expired key, 429 with ``Retry-After`` over a
        limit. ``hold_lease`` false: the request takes no concurrency slot (a response of a
        Realtime session, whose connection already holds one)."""
        if not presented:
            raise no_key()
        admin = keys.bootstrap(presented)
        if admin is not None:
            return Admission(key=admin, headers={})
        key_id = key_id_of(presented)
        if key_id is None:
            raise AuthenticationError(INCORRECT)
        lease = f"{self._lease_prefix}{next(self._lease_numbers)}" if hold_lease else ""
        requests, tokens, leases = _keys(key_id)
        result = await self._admit(
            keys=[record_key(key_id), requests, tokens, leases],
            args=[hash_key(presented), lease, self.lease_s],
        )
        refusal = result[1]
        if refusal:
            raise AuthenticationError(_KEY_REFUSALS[refusal])
        key = checked(presented, result[0])
        if len(result) == 2:
            return Admission(key=key, headers={})  # nothing to count before it runs
        counts = result[2:]
        headers = _headers(key, counts)
        if int(counts[0]) != 1:
            limit, wait = str(counts[1]), float(counts[2])
            raise RateLimitError(_refusal(key, limit, wait), limit, wait, headers)
        meter = Meter(reserver=partial(self._reserve_tokens, key) if key.tpm else None)
        if not key.max_concurrency or not lease:
            return Admission(key=key, headers=headers, meter=meter)
        self._held[lease] = leases
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._keep())
        return Admission(key=key, headers=headers, meter=meter, lease=lease)

    @needs_store
    async def _reserve_tokens(
        self,
        key: ApiKey,
        meter: Meter,
        prompt: int,
        per_generation: int,
        generations: int,
        flexible: bool,
    ) -> int:
        """:meth:`Meter.reserve` for a key with a ``tpm`` limit, in one script run."""
        assert key.tpm is not None
        _, tokens, _ = _keys(key.id)
        result = await self._reserve(
            keys=[tokens],
            args=[key.tpm, prompt, per_generation, generations, int(flexible)],
        )
        wanted = prompt + generations * per_generation
        if result[0] == "too_large":
            least = prompt + generations * (1 if flexible else per_generation)
            raise RateLimitError(
                f"Request too large for API key '{key.name}' on tokens per minute (TPM): "
                f"limit {key.tpm}, requested {least} (the prompt, estimated, plus n x "
                "max_tokens). Reduce the prompt, n or max_tokens.",
                "tokens",
                0.0,  # retrying will not help; the SDKs retry a 429 anyway
                {},
            )
        if result[0] == "no":
            wait = float(result[1])
            message = _refusal(key, "tokens", wait, needs=wanted)
            raise RateLimitError(message, "tokens", wait, {})
        granted = int(result[1])
        meter.reservations.append((int(result[2]), prompt + generations * granted))
        return granted

    async def _keep(self) -> None:
        """Renews every lease this process holds, all in one round trip, a few times per
        lease length (one task for the process, not one per request)."""
        while self._held:
            await asyncio.sleep(self.lease_s / 3)
            held = list(self._held.items())
            try:
                if is_cluster(self.redis):  # no scripts in a Cluster's pipelines
                    await asyncio.gather(
                        *(self._renew(keys=[ls], args=[lease, self.lease_s]) for lease, ls in held)
                    )
                else:
                    async with self.redis.pipeline(transaction=False) as pipe:
                        for lease, leases in held:
                            await self._renew(
                                keys=[leases], args=[lease, self.lease_s], client=pipe
                            )
                        await pipe.execute()
            except RedisError as exc:  # the leases expire on their own; the requests go on
                logger.warning("could not renew concurrency leases: %s", exc)

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()

    async def finish(self, admission: Admission) -> None:
        """Releases the lease, counts the tokens in the window and records usage. Never
        raises: the response is already sent, and a lease not released expires."""
        self._held.pop(admission.lease, None)
        meter = admission.meter
        _, tokens, leases = _keys(admission.key.id)
        try:
            await self._finish(
                keys=[tokens, leases, usage_key(admission.key.id)],
                args=[
                    meter.prompt_tokens + meter.completion_tokens,
                    admission.lease,
                    meter.prompt_tokens,
                    meter.completion_tokens,
                    round(meter.audio_seconds_in, 3),
                    round(meter.audio_seconds_out, 3),
                    *(n for reservation in meter.reservations for n in reservation),
                ],
            )
        except RedisError as exc:
            logger.warning("could not record usage of key %s: %s", admission.key.id, exc)

    @needs_store
    async def usage(self, key_id: str) -> dict[str, float]:
        """What a key has used since it was created."""
        raw = await self.redis.hgetall(usage_key(key_id))
        return {
            "requests": int(raw.get("requests", 0)),
            "prompt_tokens": int(raw.get("prompt_tokens", 0)),
            "completion_tokens": int(raw.get("completion_tokens", 0)),
            "audio_seconds_in": float(raw.get("audio_seconds_in", 0.0)),
            "audio_seconds_out": float(raw.get("audio_seconds_out", 0.0)),
        }


def _refusal(key: ApiKey, limit: str, wait: float, needs: int | None = None) -> str:
    """OpenAI's 429 message; ``needs``: the tokens the refused request would reserve."""
    what = {
        "requests": f"requests per minute (RPM): limit {key.rpm}",
        "tokens": f"tokens per minute (TPM): limit {key.tpm}",
        "concurrency": f"concurrent requests: limit {key.max_concurrency}",
    }[limit]
    needed = f" (this request needs {needs})" if needs is not None else ""
    return (
        f"Rate limit reached for API key '{key.name}' on {what}{needed}. "
        f"Please try again in {duration(wait)}."
    )
