"""What one gateway process knows of an outage of Triton or Redis, and the short wait for a
backend that is coming back.

A part the gateway depends on goes away for a few seconds and comes back: ``gateway up``
restarts a Triton or a Redis that died, Kubernetes restarts a pod, Sentinel elects a new
master. Answering 503 at once during those seconds loses requests: the OpenAI SDKs retry
twice, and a ``Retry-After`` shorter than the restart spends both retries before the part
is back. So a request that finds a backend **coming back** waits for it, up to
``GATEWAY_BACKEND_WAIT_S`` over the whole request (every call to Triton or Redis it makes
takes from the same allowance), then tries again; past that it gets its 503 with a
``Retry-After`` from what the process knows (:meth:`Outage.retry_after`).

**Coming back** is judged by each process from what it sees, not told: the backend
answered this process before (it was up since the process started: a Triton or Redis
that never answered is a configuration error, and waiting would only hide it), it fails
now, and the outage is young: shorter than three times the usual restart. The usual
restart is the length of the last outage this process saw end, else a hint
(``GATEWAY_TRITON_RESTART_S``, which ``gateway up`` sets for its replicas from the time
Triton took to start). A replica sees its gRPC channel or its Redis connection fail at the
moment the supervisor does, and sees it answer again as soon as it can be used, so it
needs nothing from the supervisor but that hint; the same rule holds under Kubernetes, a
Sentinel failover (no master for a moment) or any other manager.

Only calls whose backend never started on them are tried again: a Triton request that
failed before any response (a stream that had begun ends with its error event), a Redis
command whose connection could not be made (so a write is never done twice).

A waiting request is cancelled like any other when its client goes away: the middleware
gives the request's allowance a way to hear the disconnect (:func:`begin`), and a wait
ends there.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from starlette.requests import ClientDisconnect

#: How often a waiting call tries its backend again when nothing else said it is back
#: (a success of any other call wakes every waiter at once).
POLL_S = 0.2
#: An outage older than this many usual restarts is no longer "coming back": requests get
#: their 503 at once.
PATIENCE = 3.0
#: The longest ``Retry-After`` given: the OpenAI SDKs ignore a longer one (and back off by
#: themselves instead).
MAX_RETRY_AFTER_S = 60


class Allowance:
    """How long one request may still wait for backends, and how it hears its client leave."""

    __slots__ = ("deadline", "gone")

    def __init__(self, wait_s: float, gone: Callable[[], Awaitable[None]] | None) -> None:
        self.deadline = time.monotonic() + wait_s
        self.gone = gone


_allowance: ContextVar[Allowance | None] = ContextVar("backend_wait_allowance", default=None)


def begin(wait_s: float, gone: Callable[[], Awaitable[None]] | None = None) -> None:
    """Starts the wait allowance of the request running in this context (the middleware
    calls it once per request; the tasks the request starts share it). ``gone`` returns
    once the client has gone away."""
    _allowance.set(Allowance(wait_s, gone))


def client_gone() -> Callable[[], Awaitable[None]] | None:
    """What returns once the client of the request running here has gone away (None
    outside a request): for other waits of the request (a place in a model's queue)."""
    allowance = _allowance.get()
    return allowance.gone if allowance is not None else None


class Outage:
    """One backend as one process sees it. :meth:`up` after every call that reached it (or
    only after connections, where that is what is seen), :meth:`down` when a call finds it
    unreachable; :meth:`wait` before trying again. ``usual_s``: how long a restart takes
    until one was seen here; ``wait_s``: the most one request waits in all
    (``GATEWAY_BACKEND_WAIT_S``, 0: never); ``on_wait(outcome)`` counts each wait
    (``waited_ok`` or ``gave_up``)."""

    def __init__(
        self,
        what: str,
        usual_s: float,
        wait_s: float,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.what = what
        self.usual_s = usual_s
        self.wait_s = wait_s
        self.on_wait = on_wait
        self.seen_up = False
        self.down_since: float | None = None
        self.last_s: float | None = None
        """The length of the last outage seen to end."""
        self._back: asyncio.Event | None = None

    @property
    def expected_s(self) -> float:
        """How long an outage is expected to last (a restart)."""
        return self.last_s if self.last_s is not None else self.usual_s

    def up(self) -> None:
        """The backend answered: an outage ends (its length is remembered) and waiters go."""
        self.seen_up = True
        if self.down_since is None:
            return
        self.last_s = time.monotonic() - self.down_since
        self.down_since = None
        if self._back is not None:
            self._back.set()
            self._back = None

    def down(self) -> None:
        """A call found the backend unreachable: an outage begins, unless one is on."""
        if self.down_since is None:
            self.down_since = time.monotonic()

    def coming_back(self, now: float | None = None) -> bool:
        """Whether the backend is expected back soon (see the module docstring)."""
        if not self.seen_up or self.down_since is None:
            return False
        now = time.monotonic() if now is None else now
        return now - self.down_since < PATIENCE * max(self.expected_s, POLL_S)

    def retry_after(self, now: float | None = None) -> int:
        """Seconds a client should wait before it tries again (``Retry-After``): until the
        backend is likely back (the outage's expected length less its age), so a retry
        never lands before that; once it is overdue, as long again as it has been down, so a
        client's retries spread over an outage that turned out long. 1 to 60."""
        now = time.monotonic() if now is None else now
        age = now - self.down_since if self.down_since is not None else 0.0
        left = self.expected_s - age
        seconds = left if left > 0 else age
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(seconds)))

    def allowance(self) -> Allowance:
        """The allowance of the request running here; a call outside a request (a Realtime
        session's work, say) gets one of its own."""
        return _allowance.get() or Allowance(self.wait_s, None)

    async def wait(self, allowance: Allowance) -> bool:
        """Waits for the backend to come back, within ``allowance``: True to try again now
        (it was seen back, or it is time to look), False to give up (it is not coming back,
        or the allowance is spent). Raises Starlette's ``ClientDisconnect`` (answered 499,
        which nobody reads) when the client went away."""
        now = time.monotonic()
        if self.wait_s <= 0 or not self.coming_back(now):
            return False
        left = allowance.deadline - now
        if left <= 0:
            return False
        if self._back is None:
            self._back = asyncio.Event()
        waits: list[Awaitable[Any]] = [self._back.wait()]
        if allowance.gone is not None:
            waits.append(allowance.gone())
        tasks = [asyncio.ensure_future(w) for w in waits]
        try:
            done, _ = await asyncio.wait(
                tasks, timeout=min(left, POLL_S), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if len(tasks) > 1 and tasks[1] in done:
            raise ClientDisconnect
        return True

    def waited(self, ok: bool) -> None:
        """A call that waited ended: it reached the backend (``ok``), or gave up."""
        if self.on_wait is not None:
            self.on_wait("waited_ok" if ok else "gave_up")


class Attempt:
    """One call's tries at a backend that may be coming back (a Triton request, a Redis
    connection): the request's allowance, taken at its first failure, and whether it
    waited, counted once when it ends."""

    __slots__ = ("allowance", "outage", "waited")

    def __init__(self, outage: Outage) -> None:
        self.outage = outage
        self.allowance: Allowance | None = None
        self.waited = False

    async def failed(self) -> bool:
        """The call could not reach the backend: True to try it again (it was waited for),
        False to give up (the error's ``Retry-After`` is then :meth:`Outage.retry_after`)."""
        outage = self.outage
        outage.down()
        if self.allowance is None:
            self.allowance = outage.allowance()
        if await outage.wait(self.allowance):
            self.waited = True
            return True
        if self.waited:
            outage.waited(False)
        return False

    def reached(self) -> None:
        """The call reached the backend."""
        self.outage.up()
        if self.waited:
            self.outage.waited(True)
