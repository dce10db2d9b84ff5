"""Which request goes first, and to which Triton server (``docs/scheduling.md``).

- **A request's dispatch** (:class:`Dispatch`): its priority and the key that routes it, kept
  in a context variable for the request's task (and the tasks it starts), so that every
  backend call the request makes, whatever its kind, is scheduled alike without the
  :class:`~gateway.backend.base.Backend` methods carrying it. The API layer sets it
  (:func:`start`): ``api/auth.py`` with the key's priority for every ``/v1`` request, the
  routers that take a ``priority`` and a conversation with theirs. Priorities follow vLLM
  and Triton: **lower goes first**, 0 is the default.
- **The ring** (:class:`Ring`, :func:`place`): consistent hashing with bounded loads
  (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018;
  HAProxy's ``hash-balance-factor`` is the same idea). Each server sits at
  :data:`POINTS` points of a hash ring; a key goes to the first server clockwise from its
  hash whose load, with this request, stays within ``ceil((1 + balance) x (total load + 1) /
  servers)``; a hot key spills to the next server on the ring (the same one every time, so
  its cache warms there too).
- **The queue** (:class:`Queue`): per model, the requests waiting for a free slot, in order
  of priority, then arrival; bounded in length (a better request takes the place of the
  worst when it is full) and in wait. :class:`~gateway.backend.pool.BackendPool` holds the
  queues, the slots and the pick.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import math
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.config import Settings

#: Points per server on the ring (100 to 160 keep the shares within a few percent).
POINTS = 128

#: Request priorities a key or a request may take (vLLM's field has no bound; one here keeps
#: the ``priority`` label of the metrics few).
MIN_PRIORITY, MAX_PRIORITY = -100, 100


@dataclass(frozen=True)
class Dispatch:
    """How one request is scheduled: its priority (lower first) and the key that keeps its
    conversation on one server (None: the prompt's prefix, if long enough, else none)."""

    priority: int = 0
    route_key: str | None = None


_current: ContextVar[Dispatch | None] = ContextVar("gateway_dispatch", default=None)
_tenant: ContextVar[str] = ContextVar("gateway_tenant", default="")


def admitted(tenant: str) -> None:
    """Sets whose request runs in this context (a project, else an API key): its routing
    keys are its own, so no tenant can pin its requests to another's server or cache, nor
    learn from timing which server another's prompts went to."""
    _tenant.set(tenant)


def start(priority: int = 0, *route_keys: str | None) -> Dispatch:
    """Sets the dispatch of the request running in this context: its priority and the first
    of ``route_keys`` that is set (an ``X-Session-ID``, the root of a ``previous_response_id``
    chain, a ``prompt_cache_key``, in that order of preference), within its tenant's."""
    chosen = next((k for k in route_keys if k), None)
    route_key = f"{_tenant.get()}|{chosen}" if chosen is not None else None
    dispatch = Dispatch(priority, route_key)
    _current.set(dispatch)
    return dispatch


def current() -> Dispatch:
    """The dispatch of the running request (the default one outside a request)."""
    return _current.get() or Dispatch()


@dataclass(frozen=True)
class Policy:
    """The scheduling settings (see ``Settings``: ``triton_max_inflight`` and after)."""

    max_inflight: int = 0
    """Requests in flight per model and per server, from this replica; 0: no limit, no queue."""
    max_waiting: int = 256
    """Requests waiting per model."""
    max_wait_s: float = 30.0
    """The longest a request waits for a slot."""
    balance: float = 0.25
    """The ring's ε: a server takes at most (1 + ε) times the average load."""
    prefix_chars: int = 1024
    """A prompt at least this long routes by its first this many characters (0: never)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        return cls(
            max_inflight=settings.triton_max_inflight,
            max_waiting=settings.queue_max_waiting,
            max_wait_s=settings.queue_max_wait_s,
            balance=settings.route_balance,
            prefix_chars=settings.route_prefix_chars,
        )

    def route_key(self, dispatch: Dispatch, prompt: str | None = None) -> str | None:
        """The key that routes a request: its dispatch's, else its prompt's prefix when the
        prompt is long enough (turn k+1 of a conversation starts with turn k's prompt)."""
        if dispatch.route_key is not None:
            return dispatch.route_key
        if prompt is not None and self.prefix_chars and len(prompt) >= self.prefix_chars:
            return f"prefix:{_tenant.get()}|{prompt[: self.prefix_chars]}"
        return None


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Ring:
    """A consistent-hash ring over server addresses, :data:`POINTS` points each."""

    def __init__(self, nodes: frozenset[str]) -> None:
        self.nodes = nodes
        points = sorted((_hash(f"{node}#{i}"), node) for node in nodes for i in range(POINTS))
        self._hashes = [h for h, _ in points]
        self._owners = [node for _, node in points]

    def walk(self, key: str) -> Iterator[str]:
        """Every server once, clockwise from ``key``'s point: its home first."""
        if not self._owners:
            return
        start = bisect.bisect(self._hashes, _hash(key))
        seen: set[str] = set()
        for i in range(len(self._owners)):
            node = self._owners[(start + i) % len(self._owners)]
            if node not in seen:
                seen.add(node)
                yield node
                if len(seen) == len(self.nodes):
                    return


def place(
    ring: Ring, key: str, loads: Mapping[str, int], usable: Callable[[str], bool], balance: float
) -> tuple[str | None, bool]:
    """The server for ``key`` among ``loads``' (each server's requests in flight) and
    whether it is the key's home. The home is the first of them on the ring; the server is
    the first from there that is ``usable`` (a free slot) with its load, this request
    included, within the bound; else the least loaded usable one; None when none is."""
    cap = math.ceil((1 + balance) * (sum(loads.values()) + 1) / max(1, len(loads)))
    home = None
    for node in ring.walk(key):
        if node not in loads:
            continue
        home = home or node
        if loads[node] + 1 <= cap and usable(node):
            return node, node == home
    left = [node for node in loads if usable(node)]
    if not left:
        return None, False
    return min(left, key=lambda node: loads[node]), False


@dataclass(eq=False)
class Waiter:
    """A request waiting for a slot: its place in the order, what routes it, the servers it
    tried already, and the future the pool resolves with its server (or None: no server is
    left to try)."""

    priority: int
    arrival: int
    route: str | None
    tried: set[str]
    future: asyncio.Future[Any]
    since: float

    @property
    def rank(self) -> tuple[int, int]:
        return self.priority, self.arrival


@dataclass
class Queue:
    """The requests waiting for one model, best first (priority, then arrival), and how
    long a slot is held, on average (to tell a client when to come back)."""

    waiting: list[Waiter] = field(default_factory=list)
    hold_s: float = 1.0
    """Moving average of the time a request holds its slot."""

    def add(self, waiter: Waiter, most: int) -> Waiter | None:
        """Queues ``waiter``; when the queue is full, returns the one to refuse: the worst
        waiting, if ``waiter`` ranks before it (it is then out of the queue), else
        ``waiter`` itself (not queued)."""
        if len(self.waiting) >= most:
            if not self.waiting or self.waiting[-1].rank < waiter.rank:
                return waiter
            worst = self.waiting.pop()
            bisect.insort(self.waiting, waiter, key=lambda w: w.rank)
            return worst
        bisect.insort(self.waiting, waiter, key=lambda w: w.rank)
        return None

    def discard(self, waiter: Waiter) -> None:
        if waiter in self.waiting:
            self.waiting.remove(waiter)

    def held(self, seconds: float) -> None:
        self.hold_s += 0.2 * (seconds - self.hold_s)

    def wait_estimate(self, position: int, slots: int) -> float:
        """Seconds until the request at ``position`` (0: the head) would get one of
        ``slots`` slots, at the average hold time."""
        return (position + 1) / max(1, slots) * self.hold_s
