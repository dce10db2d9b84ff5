"""Per-key rate limits (requests per minute, tokens per minute, concurrent requests) and
usage, enforced atomically in Redis so that any number of gateway processes together never
exceed a limit. A request is let in (its key checked, ``rpm`` and concurrency) by
:mod:`gateway.state.admission`; this module has what it then uses: the tokens it reserves
and settles (:class:`Meter`, :class:`Limits`), and the key's usage.

Each limit is one Lua script run (``EVALSHA``; ``lua/limits_reserve.lua`` and
``lua/limits_finish.lua`` here, ``lua/admit.lua`` at admission): Redis runs scripts one at
a time, so the
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

import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.errors import RateLimitError
from gateway.state.keys import ApiKey
from gateway.state.redis import PREFIX, needs_store
from gateway.state.scripts import register

logger = logging.getLogger("gateway.state.limits")


def limit_keys(key_id: str) -> tuple[str, str, str]:
    """The names of a key's request and token windows and of its concurrency leases."""
    base = f"{PREFIX}rl:{{{key_id}}}"  # the key record's hash tag: one Cluster slot
    return f"{base}:requests", f"{base}:tokens", f"{base}:leases"


def usage_key(key_id: str) -> str:
    return f"{PREFIX}usage:{{{key_id}}}"


def model_usage_key(key_id: str) -> str:
    """A key's usage by model: ``<what>:<model id>`` -> count."""
    return f"{PREFIX}usage:{{{key_id}}}:models"


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``0s``, ``17s``, ``1m0s``."""
    whole = max(0, math.ceil(seconds))
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


#: Reserves tokens under a key's ``tpm`` (see :meth:`Meter.reserve`).
Reserver = Callable[["Meter", int, int, int, bool], Awaitable[int]]
#: Reserves tokens and money under a key's and its project's budgets: the meter, prompt
#: tokens (at most), tokens per generation, generations, flexible, audio seconds in
#: (:meth:`gateway.state.budgets.Budgets.reserve`).
Budgeter = Callable[["Meter", int, int, int, bool, float], Awaitable[int]]


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
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """The request's id in the budget scripts (its reservations are settled once)."""
    budget_reservations: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    """Reserved under a budget (docs/budgets.md), as (scope, day, month, tokens, money):
    settled to what was used at the end."""
    budgeter: Budgeter | None = field(default=None, repr=False)
    """Set when the key or its project may have a budget."""

    @property
    def used(self) -> bool:
        """Whether the request used tokens or audio (a refused one, a 404, used nothing)."""
        return bool(
            self.prompt_tokens
            or self.completion_tokens
            or self.audio_seconds_in
            or self.audio_seconds_out
        )

    def add_tokens(self, prompt: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion

    async def reserve(
        self,
        prompt: int,
        per_generation: int,
        generations: int,
        flexible: bool,
        prompt_bound: int | None = None,
    ) -> int:
        """Reserves ``prompt + generations x per_generation`` tokens under the key's
        ``tpm`` before generating: a 429 when they do not fit what the window has left.
        ``flexible`` (the client set no ``max_tokens``): fewer tokens per generation may be
        granted, as many as fit. Then the same under the key's and its project's budgets,
        the prompt counted at ``prompt_bound`` (the most tokens it can be) when given: 429
        ``budget_exceeded`` (or ``budget_held``). Returns the tokens granted per generation."""
        granted = per_generation
        if self.reserver is not None:
            granted = await self.reserver(self, prompt, per_generation, generations, flexible)
        if self.budgeter is not None:
            bound = prompt if prompt_bound is None else prompt_bound
            granted = await self.budgeter(self, bound, granted, generations, flexible, 0.0)
        return granted

    async def check_budget(self, audio_seconds_in: float = 0.0) -> None:
        """For work that cannot be sized beforehand (audio): 429 ``budget_exceeded`` when a
        budget of the key or its project is spent; ``audio_seconds_in``: audio to be
        transcribed, whose price is reserved."""
        if self.budgeter is not None:
            await self.budgeter(self, 0, 0, 1, False, audio_seconds_in)


class Limits:
    """The tokens admitted requests reserve and use, and each key's usage."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._finish = register(redis, "limits_finish")
        self._reserve = register(redis, "limits_reserve")

    @needs_store
    async def reserve(
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
        _, tokens, _ = limit_keys(key.id)
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
            message = refusal(key, "tokens", wait, needs=wanted)
            raise RateLimitError(message, "tokens", wait, {})
        granted = int(result[1])
        meter.reservations.append((int(result[2]), prompt + generations * granted))
        return granted

    async def settle(
        self, key_id: str, lease: str, meter: Meter, model: str = "", record: bool = True
    ) -> None:
        """Releases ``lease`` (if any), settles the reservations to the tokens used, counts
        them in the window and records usage, under ``model`` too when the request used
        tokens or audio (so a name that is no model, a 404, adds nothing). ``record`` false:
        no usage is recorded (work no client asked for: the limits still count it). Never
        raises: the response is already sent, and a lease not released expires."""
        keys, args = self.finish_call(key_id, lease, meter, model, record)
        try:
            await self._finish(keys=keys, args=args)
        except RedisError as exc:
            logger.warning("could not record usage of key %s: %s", key_id, exc)

    @staticmethod
    def finish_call(
        key_id: str, lease: str, meter: Meter, model: str = "", record: bool = True
    ) -> tuple[list[str], list[Any]]:
        """The keys and arguments of ``limits_finish.lua`` for :meth:`settle` (which
        :mod:`gateway.state.budgets` also runs in one script with a key's budget)."""
        _, tokens, leases = limit_keys(key_id)
        keys = [tokens, leases, usage_key(key_id), model_usage_key(key_id)]
        args = [
            meter.prompt_tokens + meter.completion_tokens,
            lease,
            meter.prompt_tokens,
            meter.completion_tokens,
            round(meter.audio_seconds_in, 3),
            round(meter.audio_seconds_out, 3),
            model if meter.used else "",
            int(record),
            *(n for reservation in meter.reservations for n in reservation),
        ]
        return keys, args

    @needs_store
    async def usage(self, key_id: str) -> dict[str, Any]:
        """What a key has used since it was created; ``models``: the requests and tokens of
        each model id (a LoRA adapter's id apart from its base's) that used any."""
        raw = await self.redis.hgetall(usage_key(key_id))
        by_model = await self.redis.hgetall(model_usage_key(key_id))
        models: dict[str, dict[str, int]] = {}
        for name, value in sorted(by_model.items()):
            what, _, model = str(name).partition(":")
            models.setdefault(model, {})[what] = int(value)
        return {
            "requests": int(raw.get("requests", 0)),
            "prompt_tokens": int(raw.get("prompt_tokens", 0)),
            "completion_tokens": int(raw.get("completion_tokens", 0)),
            "audio_seconds_in": float(raw.get("audio_seconds_in", 0.0)),
            "audio_seconds_out": float(raw.get("audio_seconds_out", 0.0)),
            "models": models,
        }


def refusal(key: ApiKey, limit: str, wait: float, needs: int | None = None) -> str:
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
