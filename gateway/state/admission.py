"""Who gets in: the API key a request presents, parsed, checked and its request admitted under
the key's limits, in one place.

- :func:`key_id_of` reads the public id out of ``sk-gw-<id>-<secret>``: it names the key's
  record and its rate-limit windows.
- One Lua script, ``lua/admit.lua``, reads the key's record and compares the presented key's
  hash with it, refuses a revoked or expired key and, asked to admit, lets the request in
  under the key's limits, all in one Redis round trip.
- :meth:`Gatekeeper.check` runs it to check the key alone (the admin API, ``/metrics``
  when it asks for a key, the middleware before it reads a large body): 401 for a
  missing, unknown, revoked or expired key.
- :meth:`Gatekeeper.admit` runs it to admit (every ``/v1`` request): the request counted
  under ``rpm``, refused while the key's token window is full, and a concurrency lease
  taken; 429 with ``Retry-After`` over a limit. It returns the :class:`Admission`, which
  :meth:`Gatekeeper.finish` settles once the response has been sent.
- :meth:`Gatekeeper.admit_as` admits the same way as the key whose id and hash a Realtime
  client secret holds (:mod:`gateway.state.client_secrets`); a client secret presented
  as a key anywhere else is a 401 saying that it only opens a Realtime session.
- The leases this process holds are renewed by one task (``lua/renew_lease.lua``), so a request
  keeps its slot however long it runs, and a gateway that dies frees them when they expire.

``GATEWAY_ADMIN_KEY`` is a bootstrap admin key checked without Redis, so an operator can
still see and load models while Redis is down.

What an admitted request then uses (tokens reserved and settled, usage) is
:mod:`gateway.state.limits`.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import uuid
from dataclasses import dataclass, field
from functools import partial

from pydantic import SecretStr
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.errors import AuthenticationError, RateLimitError
from gateway.metrics import Usage
from gateway.state.budgets import Budgets
from gateway.state.client_secrets import ONLY_REALTIME, is_client_secret
from gateway.state.keys import KEY_PREFIX, ApiKey, hash_key, public_record, record_key
from gateway.state.limits import Limits, Meter, duration, limit_keys, refusal
from gateway.state.redis import is_cluster, needs_store
from gateway.state.scripts import register

logger = logging.getLogger("gateway.state.admission")


def key_id_of(key: str) -> str | None:
    """The public id in ``sk-gw-<id>-<secret>``, or ``None`` when ``key`` is not shaped so."""
    if not key.startswith(KEY_PREFIX):
        return None
    key_id, _, secret = key.removeprefix(KEY_PREFIX).partition("-")
    if len(key_id) != 12 or not secret or any(c not in "0123456789abcdef" for c in key_id):
        return None
    return key_id


def _key_id(presented: str) -> str:
    """The id of the presented key; 401 when it is not shaped as a key (a client secret
    gets its own message: it is good for ``/v1/realtime`` alone)."""
    key_id = key_id_of(presented)
    if key_id is None:
        raise AuthenticationError(ONLY_REALTIME if is_client_secret(presented) else INCORRECT)
    return key_id


def no_key() -> AuthenticationError:
    return AuthenticationError(
        "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' (or, for "
        "the Anthropic SDKs, 'x-api-key: <key>')."
    )


INCORRECT = "Incorrect API key provided."
REVOKED = "This API key has been revoked."
EXPIRED = "This API key has expired."
_KEY_REFUSALS = {"unknown": INCORRECT, "revoked": REVOKED, "expired": EXPIRED}


#: The principal of ``GATEWAY_ADMIN_KEY``: no limits, usage recorded under ``admin``.
BOOTSTRAP_ADMIN = ApiKey(
    id="admin", name="GATEWAY_ADMIN_KEY", role="admin", created_at=0, redacted_value="(env)"
)


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

    def usage(self) -> Usage:
        """What the request used so far, under its model (for the metrics)."""
        meter = self.meter
        return Usage(
            self.model,
            meter.prompt_tokens,
            meter.completion_tokens,
            meter.audio_seconds_in,
            meter.audio_seconds_out,
        )


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


class Gatekeeper:
    """Checks presented keys and admits their requests (see the module's docstring)."""

    def __init__(
        self,
        redis: Redis,
        limits: Limits,
        lease_s: float,
        admin_key: SecretStr | None = None,
        budgets: Budgets | None = None,
    ) -> None:
        self.redis = redis
        self.limits = limits
        self.budgets = budgets
        self.lease_s = lease_s
        self._admin_hash = hash_key(admin_key.get_secret_value()) if admin_key else None
        self._admit = register(redis, "admit")
        self._renew = register(redis, "renew_lease")
        # Lease ids: this process's random prefix and a counter (unique across replicas).
        self._lease_prefix = f"{uuid.uuid4().hex[:12]}-"
        self._lease_numbers = itertools.count()
        self._held: dict[str, str] = {}  # lease id -> its lease set, while the request runs
        self._renewer: asyncio.Task[None] | None = None

    def _bootstrap(self, presented: str) -> ApiKey | None:
        """The principal of ``GATEWAY_ADMIN_KEY`` when it was presented (no Redis needed)."""
        if self._admin_hash is not None and hmac.compare_digest(
            hash_key(presented), self._admin_hash
        ):
            return BOOTSTRAP_ADMIN
        return None

    async def check(self, presented: str | None) -> ApiKey:
        """The key's metadata, in one Redis round trip (none for the bootstrap admin key);
        401 for a missing, unknown, revoked or expired key."""
        if not presented:
            raise no_key()
        admin = self._bootstrap(presented)
        if admin is not None:
            return admin
        key, _ = await self._run(_key_id(presented), hash_key(presented), "check")
        return key

    async def admit(self, presented: str | None, hold_lease: bool = True) -> Admission:
        """Checks the presented key and lets its request in, in one Redis round trip: 401
        for a missing, unknown, revoked or expired key, 429 with ``Retry-After`` over a
        limit. ``hold_lease`` false: the request takes no concurrency slot (a response of a
        Realtime session, whose connection already holds one)."""
        if not presented:
            raise no_key()
        admin = self._bootstrap(presented)
        if admin is not None:
            return Admission(key=admin, headers={})
        return await self.admit_as(_key_id(presented), hash_key(presented), hold_lease)

    async def admit_as(self, key_id: str, key_hash: str, hold_lease: bool = True) -> Admission:
        """:meth:`admit` for the key of id ``key_id`` whose hash is ``key_hash``, as a
        client secret holds them (:mod:`gateway.state.client_secrets`): the key as it is
        now, 401 when it has been revoked, has expired or is no longer that key."""
        if self._admin_hash is not None and hmac.compare_digest(key_hash, self._admin_hash):
            return Admission(key=BOOTSTRAP_ADMIN, headers={})
        lease = f"{self._lease_prefix}{next(self._lease_numbers)}" if hold_lease else ""
        key, counts = await self._run(key_id, key_hash, "admit", lease)
        if not counts:
            return self._budgeted(Admission(key=key, headers={}))  # nothing counted yet
        headers = _headers(key, counts)
        if int(counts[0]) != 1:
            limit, wait = str(counts[1]), float(counts[2])
            raise RateLimitError(refusal(key, limit, wait), limit, wait, headers)
        meter = Meter(reserver=partial(self.limits.reserve, key) if key.tpm else None)
        if not key.max_concurrency or not lease:
            return self._budgeted(Admission(key=key, headers=headers, meter=meter))
        self._held[lease] = limit_keys(key.id)[2]
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._keep())
        return self._budgeted(Admission(key=key, headers=headers, meter=meter, lease=lease))

    def _budgeted(self, admission: Admission) -> Admission:
        """``admission`` whose meter reserves under the key's and its project's budgets,
        if it may have any (docs/budgets.md)."""
        if self.budgets is not None and self.budgets.applies(admission.key):
            admission.meter.budgeter = partial(self._reserve_budget, admission)
        return admission

    async def _reserve_budget(
        self,
        admission: Admission,
        meter: Meter,
        prompt: int,
        per_generation: int,
        generations: int,
        flexible: bool,
        audio_seconds_in: float,
    ) -> int:
        """:meth:`Budgets.reserve` for ``admission``, under the model it uses by then (the
        service names it after the request was admitted)."""
        assert self.budgets is not None
        return await self.budgets.reserve(
            admission.key,
            admission.model,
            meter,
            prompt,
            per_generation,
            generations,
            flexible,
            audio_seconds_in,
        )

    @needs_store
    async def _run(
        self, key_id: str, key_hash: str, mode: str, lease: str = ""
    ) -> tuple[ApiKey, list[str]]:
        """One run of ``admit.lua``: the key's metadata and the script's counts (none when
        it only checked the key, or the key has no limits); 401 for a refused key."""
        result = await self._admit(
            keys=[record_key(key_id), *limit_keys(key_id)],
            args=[key_hash, mode, lease, self.lease_s],
        )
        if result[1]:
            raise AuthenticationError(_KEY_REFUSALS[result[1]])
        return public_record(result[0]), result[2:]

    async def finish(self, admission: Admission, record: bool = True) -> None:
        """Releases the lease, counts the tokens in the window and records usage (not when
        ``record`` is false: see :meth:`Limits.settle`). Never raises: the response is
        already sent, and a lease not released expires."""
        self._held.pop(admission.lease, None)
        key, meter = admission.key, admission.meter
        if self.budgets is None:
            await self.limits.settle(key.id, admission.lease, meter, admission.model, record)
            return
        # The key's limits and budget in one script run (its slot); its project's at once.
        finish = self.limits.finish_call(key.id, admission.lease, meter, admission.model, record)
        await self.budgets.settle(key, admission.model, meter, record, finish)

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
