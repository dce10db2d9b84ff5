"""Several Triton servers behind one :class:`~gateway.backend.base.Backend`.

``GATEWAY_TRITON_URL`` may name more than one server: a comma-separated list of
``host:port``, and ``dns:///name:port`` entries, each resolved to every address it has (a
Kubernetes headless Service lists its ready pods this way) and resolved again at every
check. One gRPC connection to a Service's virtual IP would pin every request of a replica
to one pod; here each server has its own connection and the gateway picks per request.

- **Pick**: among the servers that are up and have the model ready, the one with the fewest
  requests in flight from this process (ties take turns).
- **Routing around**: a server that cannot be reached, or does not have the model, before
  the first response of a request, is skipped and the request goes to the next one; a
  server found unreachable is left out until a check finds it ready again. After the first
  response a failure is the request's (a stream cannot move).
- **Checks**: every ``check_every_s`` each server is asked whether it is ready and which
  models it has ready.
- **The model list** is the union of the servers'; loading and unloading a model apply to
  every server that is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

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
from gateway.errors import BackendUnavailableError, GatewayError, ModelNotFoundError

logger = logging.getLogger("gateway")
T = TypeVar("T")
DNS = "dns:///"
Resolver = Callable[[str, int], Awaitable[list[str]]]


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


@dataclass
class BackendPool:
    """Implements :class:`Backend` over the servers of ``url``; ``make`` builds the client
    of one server from its address."""

    url: str
    make: Callable[[str], Backend]
    check_every_s: float = 1.0
    resolver: Resolver = resolve
    servers: dict[str, _Server] = field(default_factory=dict)
    _checker: asyncio.Task[None] | None = None
    _turns: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

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

    async def _check(self, server: _Server) -> None:
        try:
            up = await server.backend.ready()
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

    def _pick(self, model: str, tried: set[str]) -> _Server | None:
        """The least busy server not tried yet: first those that have the model ready, then
        those that are up (the last check may predate a load), then any."""
        left = [s for s in self.servers.values() if s.address not in tried]
        for group in (
            [s for s in left if s.up and model in s.models],
            [s for s in left if s.up],
            left,
        ):
            if group:
                chosen = min(group, key=lambda s: (s.busy, s.order))
                chosen.order = next(self._turns)  # ties take turns
                return chosen
        return None

    async def _stream(
        self, model: str, call: Callable[[Backend], AsyncGenerator[T, None]]
    ) -> AsyncGenerator[T, None]:
        """``call`` on one server, and on the next while servers are unreachable or lack the
        model; only while nothing was received (a stream cannot move)."""
        await self._started()
        tried: set[str] = set()
        last: GatewayError = BackendUnavailableError("No Triton server is reachable")
        while (server := self._pick(model, tried)) is not None:
            tried.add(server.address)
            server.busy += 1
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
                server.busy -= 1
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

    async def ready(self) -> bool:
        await self._started()
        return any(s.up for s in self.servers.values())

    async def models(self) -> list[ModelInfo]:
        merged: dict[str, ModelInfo] = {}
        for listed in await self._everywhere(lambda b: b.models()):
            for info in listed:
                if info.name not in merged or (info.ready and not merged[info.name].ready):
                    merged[info.name] = info
        return sorted(merged.values(), key=lambda info: info.name)

    async def repository(self) -> list[RepositoryModel]:
        merged: dict[str, RepositoryModel] = {}
        for listed in await self._everywhere(lambda b: b.repository()):
            for entry in listed:
                if entry.name not in merged or entry.state == "READY":
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
        return self._stream(model, lambda b: b.generate(model, prompt, options, stream, images))

    def synthesize(
        self, model: str, text: str, voice: str, speed: float
    ) -> AsyncGenerator[AudioChunk, None]:
        return self._stream(model, lambda b: b.synthesize(model, text, voice, speed))

    def transcribe(
        self, model: str, audio: npt.NDArray[np.float32], options: TranscriptionOptions
    ) -> AsyncGenerator[Segment, None]:
        return self._stream(model, lambda b: b.transcribe(model, audio, options))

    async def embed(self, model: str, texts: list[str], input_type: str | None) -> Embeddings:
        async def one(backend: Backend) -> AsyncGenerator[Embeddings, None]:
            yield await backend.embed(model, texts, input_type)

        async with aclosing(self._stream(model, one)) as answers:
            async for embeddings in answers:
                return embeddings
        raise AssertionError("the pool yields an answer or raises")

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
        await asyncio.gather(*(s.backend.close() for s in self.servers.values()))
