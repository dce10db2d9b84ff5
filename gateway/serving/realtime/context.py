"""What the parts of a session are given instead of the session: the services they call
(:class:`Services`), the caller's admission (:data:`AdmitUses`), the session's events out
(:class:`Emit`) and its queue of work (:class:`Jobs`), and, for the event handlers, the
narrow :class:`SessionContext` of these with the session's settings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.backend import Backend
from gateway.errors import GatewayError
from gateway.metrics import Metrics
from gateway.serving.catalog import ModelCatalog
from gateway.serving.chat import ChatService
from gateway.serving.realtime.items import Bounds, Use
from gateway.serving.realtime.protocol import ClientEventError
from gateway.serving.realtime.session_config import SessionConfig
from gateway.state.admission import Admission

logger = logging.getLogger("gateway.realtime")

#: Transcriptions and responses a session may have waiting: a conversation has two at
#: most (a turn's transcription, then its answer); past it, an event that would add one is
#: refused, so a client cannot queue work (and the audio it holds) without end.
MAX_QUEUED_JOBS = 16


class Emit(Protocol):
    """Sends a server event of type ``kind`` with ``fields``."""

    def __call__(self, kind: str, **fields: Any) -> Awaitable[None]: ...


#: Admits one request of the session (a response, a transcription) under the key's limits,
#: the models of ``uses`` checked against the key (``record_refusal`` false: a 403 is not
#: recorded in usage, for a request no client made). A 429 or 403 raises.
AdmitUses = Callable[[list[Use], bool], Awaitable[Admission]]
#: Records what an admitted request used (never raises).
Record = Callable[[Admission], Awaitable[None]]


@dataclass(frozen=True)
class Services:
    """The services a session's work calls, the same for every session of a replica."""

    backend: Backend
    chat: ChatService
    catalog: ModelCatalog
    bounds: Bounds
    metrics: Metrics | None
    settle: Record
    """Records an admitted request's usage and ends it."""
    release: Record
    """Ends a request of the gateway's own making (an answer made ahead and dropped): the
    key's limits count what it used, its usage does not."""
    refuse: Record
    """Ends an admission refused after it was made (a spent budget): recorded as refused."""


class Jobs:
    """The session's work (transcriptions, responses), run in order on one task, so the
    receive loop never waits for a model and audio keeps flowing into the VAD."""

    def __init__(self, error: Callable[[GatewayError], Awaitable[None]]) -> None:
        self._queue: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue(MAX_QUEUED_JOBS)
        self._error = error
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    def check_room(self) -> None:
        if self._queue.full():
            raise ClientEventError(
                f"The session already has {MAX_QUEUED_JOBS} transcriptions and responses "
                "waiting; wait for them to finish.",
                code="too_many_pending_jobs",
            )

    def put(self, job: Callable[[], Awaitable[None]]) -> None:
        """Queues ``job`` (refused past :data:`MAX_QUEUED_JOBS`)."""
        self.check_room()
        self._queue.put_nowait(job)

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        self._task = asyncio.create_task(self._work())

    async def stop(self) -> None:
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                await job()
            except asyncio.CancelledError:
                if self.closed:
                    raise
            except GatewayError as exc:
                await self._error(exc)
            except Exception:
                logger.exception("realtime job failed")
                await self._error(GatewayError("The server had an error in this session."))


@dataclass
class SessionContext:
    """What an event handler may use of its session: its id and settings, its events out,
    its work queue and its admission; not the other handlers (each is given those it
    calls) nor the connection."""

    id: str
    config: SessionConfig
    speech_model: str
    services: Services
    emit: Emit
    error: Callable[[GatewayError], Awaitable[None]]
    jobs: Jobs
    admit: AdmitUses
    closed: bool = False
