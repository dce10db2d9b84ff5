"""Several Triton servers behind one :class:`~gateway.backend.base.Backend`.

``GATEWAY_TRITON_URL`` may name more than one server: a comma-separated list of
``host:port``, and ``dns:///name:port`` entries, each resolved to every address it has (a
Kubernetes headless Service lists its ready pods this way) and resolved again at every
check. One gRPC connection to a Service's virtual IP would pin every request of a replica
to one pod; here each server has its own connection and the gateway picks per request.

- **Pick**: among the servers that are up and have the model ready, the one with the fewest
  requests in flight from this process (ties take turns); a request with a routing key (its
  conversation's, or its long prompt's prefix) goes to the key's server on a hash ring
  unless that one is past the load bound (:mod:`gateway.backend.scheduling`), so a
  conversation finds its prefix cache where it left it.
- **Slots and the queue** (``GATEWAY_TRITON_MAX_INFLIGHT``): at most that many requests per
  model and per server in flight; the rest wait in the model's queue by priority, then
  arrival, and take the first slot that frees on any server; past the queue's length or
  wait, a 503 ``overloaded``.
- **Routing around**: a server that cannot be reached, or does not have the model, before
  the first response of a request, is skipped and the request goes to the next one; a
  server found unreachable is left out until a check finds it ready again. After the first
  response a failure is the request's (a stream cannot move).
- **Checks**: every ``check_every_s`` each server is asked whether it serves (is live: a
  model of its that failed to load does not take it out) and which models it has ready.
- **The model list** is the union of the servers'; loading and unloading a model apply to
  every server that is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from starlette.requests import ClientDisconnect

from gateway import outages
from gateway.backend import scheduling
from gateway.backend.base import (
    AudioChunk,
    Backend,
    ChatImage,
    Embeddings,
    GenerationChunk,
    ModelInfo,
    RepositoryModel,
    SamplingOptions,
    Segment,
    TranscriptionOptions,
)
from gateway.backend.scheduling import Dispatch, Policy, Queue, Ring, Waiter, place
from gateway.errors import (
    BackendUnavailableError,
    GatewayError,
    ModelNotFoundError,
    OverloadedError,
)
from gateway.metrics import Metrics

logger = logging.getLogger("gateway")
T = TypeVar("T")
DNS = "dns:///"
Resolver = Callable[[str, int], Awaitable[list[str]]]
#: What a pick returns when every server it may take is at its limit for the model.
FULL = "full"


def targets(url: str) -> list[str]:
    """The entries of ``GATEWAY_TRITON_URL`` (one or more, comma-separated)."""
    return [part.strip() for part in url.split(",") if part.strip()]


def is_pool(url: str) -> bool:
    """Whether ``url`` names more than one server, or a DNS name to resolve."""
    entries = targets(url)
    return len(entries) > 1 or any(e.startswith(DNS) for e in entries)


async def resolve(host: str, port: int) -> list[str]:
    """Every address of ``host`` (IPv4 and IPv6), as gRPC targets, in a stable order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found = []
    for family, *_, address in infos:
        ip = str(address[0])
        target = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if target not in found:
            found.append(target)
    return sorted(found)


@dataclass(eq=False)
class _Server:
    address: str
    backend: Backend
    up: bool = False
    models: frozenset[str] = frozenset()
    busy: int = 0
    order: int = 0
    running: dict[str, int] = field(default_factory=dict)
    """Requests in flight per model (the slots ``Policy.max_inflight`` bounds)."""


@dataclass
class BackendPool:
    """Implements :class:`Backend` over the servers of ``url``; ``make`` builds the client
    of one server from its address."""

    url: str
    make: Callable[[str], Backend]
    check_every_s: float = 1.0
    resolver: Resolver = resolve
    policy: Policy = field(default_factory=Policy)
    metrics: Metrics | None = None
    servers: dict[str, _Server] = field(default_factory=dict)
    _checker: asyncio.Task[None] | None = None
    _turns: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _arrivals: itertools.count[int] = field(default_factory=itertools.count)
    _queues: dict[str, Queue] = field(default_factory=dict)
    _ring: Ring = field(default_factory=lambda: Ring(frozenset()))

    # -- the servers -----------------------------------------------------------------------

    async def _addresses(self) -> list[str]:
        found: list[str] = []
        for entry in targets(self.url):
            if not entry.startswith(DNS):
                found.append(entry)
                continue
            host, _, port = entry.removeprefix(DNS).rpartition(":")
            try:
                found += await self.resolver(host, int(port))
            except OSError as exc:  # keep the servers it had until the name resolves again
                logger.warning("could not resolve %s: %s", host, exc)
                found += [s.address for s in self.servers.values()]
        return list(dict.fromkeys(found))

    async def check(self) -> None:
        """Resolves the names again and asks every server what it has ready."""
        addresses = await self._addresses()
        for address in addresses:
            if address not in self.servers:
                self.servers[address] = _Server(address, self.make(address))
        for address in [a for a in self.servers if a not in addresses]:
            gone = self.servers.pop(address)
            logger.warning("Triton server %s left the pool", address)
            asyncio.get_running_loop().create_task(self._close_when_idle(gone))
        await asyncio.gather(*(self._check(s) for s in list(self.servers.values())))
        for model in list(self._queues):  # a server back, or new: slots for the waiting
            self._dispatch(model)

    async def _check(self, server: _Server) -> None:
        try:
            up = await server.backend.live()
            entries = await server.backend.repository() if up else []
        except GatewayError:
            up, entries = False, []
        if up != server.up:
            logger.warning("Triton server %s is %s", server.address, "ready" if up else "down")
        server.up = up
        server.models = frozenset(e.name for e in entries if e.state == "READY")

    async def _close_when_idle(self, server: _Server, most_s: int = 600) -> None:
        """Closes a server's client once its requests in flight ended (within ``most_s``)."""
        for _ in range(most_s):
            if not server.busy:
                break
            await asyncio.sleep(1)
        await server.backend.close()

    async def _keep_checking(self) -> None:
        while True:
            await asyncio.sleep(self.check_every_s)
            try:
                await self.check()
            except Exception:  # the next round tries again; requests go on meanwhile
                logger.exception("checking the Triton servers failed")

    async def _started(self) -> None:
        if self._checker is None:
            self._checker = asyncio.get_running_loop().create_task(self._keep_checking())
            await self.check()

    def _free(self, server: _Server, model: str) -> bool:
        limit = self.policy.max_inflight
        return not limit or server.running.get(model, 0) < limit

    def _pick(self, model: str, tried: set[str], route: str | None) -> _Server | str | None:
        """The server for a request not tried there yet: first among those that have the
        model ready, then those that are up (the last check may predate a load), then any;
        within that group the key's server on the ring (``route``), else the least busy.
        :data:`FULL` when the group's servers are all at their limit for the model (the
        request waits), None when no server is left to try."""
        left = [s for s in self.servers.values() if s.address not in tried]
        for group in (
            [s for s in left if s.up and model in s.models],
            [s for s in left if s.up],
            left,
        ):
            if not group:
                continue
            if route is not None:
                chosen, home = self._place(model, group, route)
                outcome = "affinity" if home else "spill"
            else:
                free = [s for s in group if self._free(s, model)]
                chosen = min(free, key=lambda s: (s.busy, s.order)) if free else None
                outcome = "fallback"
            if chosen is None:
                return FULL
            chosen.order = next(self._turns)  # ties take turns
            if self.metrics is not None and len(self.servers) > 1:
                self.metrics.routes.labels(outcome).inc()
            return chosen
        return None

    def _place(self, model: str, group: list[_Server], route: str) -> tuple[_Server | None, bool]:
        """The key's server on the ring among ``group``, within the load bound."""
        if self._ring.nodes != self.servers.keys():
            self._ring = Ring(frozenset(self.servers))
        by_address = {s.address: s for s in group}
        address, home = place(
            self._ring,
            f"{model}\n{route}",
            {s.address: s.busy for s in group},
            lambda a: self._free(by_address[a], model),
            self.policy.balance,
        )
        return (by_address[address] if address is not None else None), home

    # -- slots and the queue ---------------------------------------------------------------

    def _take(self, server: _Server, model: str, waiter: Waiter | None, priority: int) -> None:
        server.busy += 1
        server.running[model] = server.running.get(model, 0) + 1
        if self.metrics is not None and self.policy.max_inflight:
            waited = time.monotonic() - waiter.since if waiter is not None else 0.0
            self.metrics.queue_wait.labels(str(priority)).observe(waited)

    def _release(self, server: _Server, model: str, started: float | None) -> None:
        """Frees the slot (``started``: when the request began there, None if it never
        did) and hands it on."""
        server.busy -= 1
        server.running[model] -= 1
        if self.policy.max_inflight:
            if started is not None:
                self._queues.setdefault(model, Queue()).held(time.monotonic() - started)
            self._dispatch(model)

    def _dispatch(self, model: str) -> None:
        """Hands the free slots to the waiting requests, best first."""
        queue = self._queues.get(model)
        if queue is None:
            return
        for waiter in list(queue.waiting):
            if waiter.future.done():  # gone: it is leaving the queue
                queue.discard(waiter)
                continue
            chosen = self._pick(model, waiter.tried, waiter.route)
            if chosen == FULL:
                break
            queue.discard(waiter)
            if isinstance(chosen, _Server):
                self._take(chosen, model, waiter, waiter.priority)
            waiter.future.set_result(chosen)
        self._depth(model, queue)

    def _depth(self, model: str, queue: Queue) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.labels(model).set(len(queue.waiting))

    def _slots(self, model: str) -> int:
        """Slots the model has over the servers that have it (all servers if none says so)."""
        having = [s for s in self.servers.values() if s.up and model in s.models]
        return self.policy.max_inflight * max(1, len(having) or len(self.servers))

    def _shed(self, model: str, reason: str, position: int) -> OverloadedError:
        queue = self._queues.setdefault(model, Queue())
        wait = queue.wait_estimate(position, self._slots(model))
        if self.metrics is not None:
            self.metrics.shed.labels(model, reason).inc()
        if reason == "queue_full":
            message = (
                f"The gateway is overloaded: {len(queue.waiting)} requests are already waiting "
                f"for the model '{model}'. Try again later."
            )
        else:
            message = (
                f"The gateway is overloaded: this request waited {self.policy.max_wait_s:g} s "
                f"for the model '{model}' without getting a slot. Try again later."
            )
        return OverloadedError(message, reason, wait)

    async def _acquire(
        self, model: str, tried: set[str], dispatch: Dispatch, route: str | None
    ) -> _Server | None:
        """A slot on a server for the request (None: no server left to try): at once when
        one is free and nobody waits for the model, else after those ahead of it."""
        queue = self._queues.get(model)
        if queue is None or not queue.waiting:
            chosen = self._pick(model, tried, route)
            if chosen != FULL:
                if isinstance(chosen, _Server):
                    self._take(chosen, model, None, dispatch.priority)
                return chosen if isinstance(chosen, _Server) else None
        queue = self._queues.setdefault(model, Queue())
        waiter = Waiter(
            dispatch.priority,
            next(self._arrivals),
            route,
            tried,
            asyncio.get_running_loop().create_future(),
            time.monotonic(),
        )
        refused = queue.add(waiter, self.policy.max_waiting)
        if refused is waiter:
            raise self._shed(model, "queue_full", len(queue.waiting))
        if refused is not None and not refused.future.done():  # a worse one makes room
            refused.future.set_exception(self._shed(model, "queue_full", len(queue.waiting)))
        self._depth(model, queue)
        self._dispatch(model)  # a slot may have freed meanwhile
        gone = outages.client_gone()
        left: asyncio.Task[None] | None = None
        try:
            async with asyncio.timeout(self.policy.max_wait_s):
                if gone is not None:
                    # A client that goes away leaves the queue (a stream waits here before
                    # its response starts, outside the route's disconnect watch).
                    left = asyncio.ensure_future(gone())
                    await asyncio.wait((waiter.future, left), return_when=FIRST_COMPLETED)
                    if not waiter.future.done():
                        raise ClientDisconnect
                got: _Server | None = await waiter.future
                return got
        except TimeoutError:
            if (taken := _result(waiter.future)) is not None:
                return taken  # a slot came as the time ran out
            position = queue.waiting.index(waiter) if waiter in queue.waiting else 0
            raise self._shed(model, "wait_timeout", position) from None
        except (ClientDisconnect, asyncio.CancelledError):
            # The client went away: its slot, if one came meanwhile, goes on.
            if (taken := _result(waiter.future)) is not None:
                self._release(taken, model, None)
            raise
        finally:
            if left is not None:
                left.cancel()
            queue.discard(waiter)
            self._depth(model, queue)

    async def _stream(
        self,
        model: str,
        call: Callable[[Backend], AsyncGenerator[T, None]],
        prompt: str | None = None,
    ) -> AsyncGenerator[T, None]:
        """``call`` on one server, and on the next while servers are unreachable or lack the
        model; only while nothing was received (a stream cannot move). The request holds
        its slot until it ends (a stream: its last chunk)."""
        await self._started()
        dispatch = scheduling.current()
        route = self.policy.route_key(dispatch, prompt)
        tried: set[str] = set()
        last: GatewayError = BackendUnavailableError("No Triton server is reachable")
        while (server := await self._acquire(model, tried, dispatch, route)) is not None:
            tried.add(server.address)
            started = time.monotonic()
            received = False
            try:
                async with aclosing(call(server.backend)) as results:
                    async for item in results:
                        received = True
                        yield item
                return
            except (BackendUnavailableError, ModelNotFoundError) as exc:
                if received:
                    raise
                if isinstance(exc, BackendUnavailableError):
                    server.up = False
                last = exc
            finally:
                self._release(server, model, started)
        raise last

    async def _everywhere(self, call: Callable[[Backend], Awaitable[T]]) -> list[T]:
        """``call`` on every server that is up (all of them if none seems up)."""
        await self._started()
        chosen = [s for s in self.servers.values() if s.up] or list(self.servers.values())
        if not chosen:
            raise BackendUnavailableError("No Triton server is reachable")
        results = await asyncio.gather(*(call(s.backend) for s in chosen), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if not isinstance(r, BaseException)]

    # -- Backend ---------------------------------------------------------------------------

    async def live(self) -> bool:
        await self._started()
        return any(s.up for s in self.servers.values())

    async def models(self) -> list[ModelInfo]:
        """The union of the servers' models: a model ready on one server is ready; one
        ready on none shows a server's state that says most (failed over never loaded)."""
        merged: dict[str, ModelInfo] = {}
        for listed in await self._everywhere(lambda b: b.models()):
            for info in listed:
                if info.name not in merged or _says_more(info, merged[info.name]):
                    merged[info.name] = info
        return sorted(merged.values(), key=lambda info: info.name)

    async def repository(self) -> list[RepositoryModel]:
        merged: dict[str, RepositoryModel] = {}
        for listed in await self._everywhere(lambda b: b.repository()):
            for entry in listed:
                if entry.name not in merged or _says_more(entry, merged[entry.name]):
                    merged[entry.name] = entry
        return sorted(merged.values(), key=lambda entry: entry.name)

    async def load_model(self, name: str) -> None:
        await self._everywhere(lambda b: b.load_model(name))
        await self.check()

    async def unload_model(self, name: str) -> None:
        await self._everywhere(lambda b: b.unload_model(name))
        await self.check()

    def generate(
        self,
        model: str,
        prompt: str,
        options: SamplingOptions,
        stream: bool,
        images: tuple[ChatImage, ...] = (),
    ) -> AsyncGenerator[GenerationChunk, None]:
        return self._stream(
            model, lambda b: b.generate(model, prompt, options, stream, images), prompt
        )

    def synthesize(
        self, model: str, text: str, voice: str, speed: float, instructions: str | None = None
    ) -> AsyncGenerator[AudioChunk, None]:
        return self._stream(model, lambda b: b.synthesize(model, text, voice, speed, instructions))

    def transcribe(
        self, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> AsyncGenerator[Segment, None]:
        return self._stream(model, lambda b: b.transcribe(model, audio, options))

    async def embed(self, model: str, texts: list[str], input_type: str | None) -> Embeddings:
        return await self._answer(model, lambda backend: backend.embed(model, texts, input_type))

    async def count_tokens(self, model: str, text: str) -> tuple[int, bool]:
        return await self._answer(model, lambda backend: backend.count_tokens(model, text))

    async def _answer(self, model: str, call: Callable[[Backend], Awaitable[T]]) -> T:
        """One answer of ``call`` (not a stream), from a server as :meth:`_stream` picks it."""

        async def one(backend: Backend) -> AsyncGenerator[T, None]:
            yield await call(backend)

        async with aclosing(self._stream(model, one)) as answers:
            async for answer in answers:
                return answer
        raise AssertionError("the pool yields an answer or raises")

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
        await asyncio.gather(*(s.backend.close() for s in self.servers.values()))


#: Which server's state of a model the pool shows, most telling first: ready on any server
#: is ready; else a failed load (its reason is what the operator needs), and so on.
_TELLING = ("ready", "failed", "loading", "unloading", "unloaded", "not_loaded")


def _says_more(one: ModelInfo | RepositoryModel, other: ModelInfo | RepositoryModel) -> bool:
    """Whether ``one`` server's state of a model tells more than ``other``'s."""
    return _TELLING.index(one.status) < _TELLING.index(other.status)


def _result(future: asyncio.Future[_Server | None]) -> _Server | None:
    """The server a waiter's future was resolved with, if it was."""
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    return None
