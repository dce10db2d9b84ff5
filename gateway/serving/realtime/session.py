"""A Realtime session: the state machine that acts on each client event in order, through
the parts that do each job (:class:`Configurator`, :class:`Conversation`, :class:`Turns`,
the responses), and runs the work on one worker task; and :class:`RealtimeServices`, what
every session shares and the factory that opens one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from gateway.backend import Backend
from gateway.config import Settings
from gateway.errors import GatewayError
from gateway.metrics import Metrics
from gateway.serving.catalog import DefaultModels, ModelCatalog
from gateway.serving.chat import ChatService
from gateway.serving.realtime.buffer import Audio
from gateway.serving.realtime.config import Configurator, SessionConfig, _require, _uses
from gateway.serving.realtime.conversation import Conversation
from gateway.serving.realtime.events import (
    Bounds,
    ClientEventError,
    Item,
    _fields,
    _id,
    _object,
    _parse,
    _Use,
)
from gateway.serving.realtime.responder import Response, _response_cancel, _response_create
from gateway.serving.realtime.speculation import Speculation
from gateway.serving.realtime.transcription import _transcribe_item, _Transcription
from gateway.serving.realtime.turns import Turns
from gateway.state.admission import Admission
from gateway.state.keys import ApiKey

logger = logging.getLogger("gateway.realtime")

Send = Callable[[dict[str, Any]], Awaitable[None]]

#: Transcriptions and responses a session may have waiting: a conversation has two at
#: most (a turn's transcription, then its answer); past it, an event that would add one is
#: refused, so a client cannot queue work (and the audio it holds) without end.
MAX_QUEUED_JOBS = 16

#: Model names of OpenAI's own that mean "the gateway's default" (``gpt-realtime``,
#: ``whisper-1``, ``gpt-4o-transcribe``...).
_OPENAI_MODEL_PREFIXES = ("gpt-", "whisper-")

#: Admits one more request of a session's caller under the key's limits as they are now,
#: without a concurrency slot of its own (the connection holds one): a 401 or 429 raises.
#: The API layer makes it from the key the connection presented, which the session never
#: sees.
Admit = Callable[[], Awaitable[Admission]]
#: Settles an admission once its request has ended: its tokens and usage (never raises).
Settle = Callable[[Admission, bool], Awaitable[None]]


class RealtimeServices:
    """What every session shares."""

    def __init__(
        self,
        backend: Backend,
        catalog: ModelCatalog,
        chat: ChatService,
        models: DefaultModels,
        finish: Settle,
        settings: Settings,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.bounds = Bounds.of(settings)
        self.backend = backend
        self.catalog = catalog
        self.chat = chat
        self.models = models
        self.finish = finish
        self.metrics = metrics

    async def model_for(self, task: str, requested: str | None, param: str) -> str:
        """The model of ``task`` a session asked for: one of ours by name, or the default
        for one of OpenAI's names (``gpt-realtime``, ``whisper-1``...) or none; a 404 (or a
        400 for a model of another task) naming ``param`` for anything else."""
        if requested:
            found = await self.catalog.find(requested)
            if found is not None and found.task == task:
                return requested
            if not requested.startswith(_OPENAI_MODEL_PREFIXES):
                try:
                    await self.catalog.get(requested, task)  # raises the right 404 or 400
                except GatewayError as exc:
                    exc.param = param
                    raise
        return await self.models.pick(task)

    async def configure(
        self, requested_model: str | None, key: ApiKey, session: dict[str, Any] | None = None
    ) -> SessionConfig:
        """The settings a session of ``key`` starts with: the defaults for
        ``requested_model``, then ``session`` (a ``session.update``'s session, as a client
        secret holds it) applied. A refused field raises (a 400 naming it), and a model the
        key may not use a 403."""
        model = await self.model_for("chat", requested_model, "model")
        info = await self.models.info("speech")
        config = SessionConfig(
            model=model,
            voice=info.voices[0] if info.voices else "alloy",
            transcription_model=await self.models.pick("transcription"),
            instructions=self.settings.realtime_instructions,
            temperature=self.settings.realtime_temperature,
        )
        if session is not None:
            config = await Configurator(self, info.name)._configured(config, session)
        _require(key, _uses(config, info.name))
        return config

    async def open(
        self,
        requested_model: str | None,
        key: ApiKey,
        admit: Admit,
        send: Send,
        session: dict[str, Any] | None = None,
    ) -> RealtimeSession:
        """A session of ``key`` (403 unless it may use the models the session will), whose
        requests ``admit`` lets in, configured as :meth:`configure` says."""
        config = await self.configure(requested_model, key, session)
        info = await self.models.info("speech")
        return RealtimeSession(self, config, info.name, key, admit, send)

    async def settle(self, admission: Admission) -> None:
        """Records what a session's request used (never raises)."""
        await self.finish(admission, True)
        if self.metrics is not None:
            self.metrics.record_usage(admission)

    async def release(self, admission: Admission) -> None:
        """Ends a request of the gateway's own making (an answer made ahead and dropped):
        the key's limits count what it used, its usage does not (never raises)."""
        await self.finish(admission, False)


_Handler = Callable[[dict[str, Any]], Awaitable[None]]


class RealtimeSession:
    def __init__(
        self,
        services: RealtimeServices,
        config: SessionConfig,
        speech_model: str,
        key: ApiKey,
        admit: Admit,
        send: Send,
    ) -> None:
        self.services = services
        self.config = config
        self.speech_model = speech_model
        self.key = key
        """The key the session was opened with: ``session.update`` checks models against
        it. Each request is admitted with the key as it is then (:meth:`_admit`)."""
        self._admit_request = admit
        self._send = send
        self.id = _id("sess")
        self.configurator = Configurator(services, speech_model)
        self.conversation = Conversation(services.bounds, self.emit)
        self.turns = Turns(self)
        self._transcriptions: set[_Transcription] = set()
        """Transcription requests not yet recorded (recorded at the latest on close)."""
        self._jobs: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue(MAX_QUEUED_JOBS)
        self._worker: asyncio.Task[None] | None = None
        self.response: Response | None = None
        """The conversation's response, queued or running (one at a time)."""
        self.responses: dict[str, Response] = {}
        """Every response queued or running, out-of-band ones included."""
        self.closed = False
        self.speculations: set[Speculation] = set()
        """Answers made ahead not yet dropped (see speculation.py): at most one is held by
        the session's turn or its response; the set makes sure none outlives the session."""
        self._handlers: dict[str, tuple[_Handler, frozenset[str]]] = {
            "session.update": (self._session_update, frozenset({"session"})),
            "input_audio_buffer.append": (self.turns._append, frozenset({"audio"})),
            "input_audio_buffer.commit": (self.turns._commit_event, frozenset()),
            "input_audio_buffer.clear": (self.turns._clear, frozenset()),
            "conversation.item.create": (
                self._item_create,
                frozenset({"item", "previous_item_id"}),
            ),
            "conversation.item.delete": (self.conversation._item_delete, frozenset({"item_id"})),
            "conversation.item.retrieve": (
                self.conversation._item_retrieve,
                frozenset({"item_id"}),
            ),
            "conversation.item.truncate": (
                self.conversation._item_truncate,
                frozenset({"item_id", "content_index", "audio_end_ms"}),
            ),
            "response.create": (partial(_response_create, self), frozenset({"response"})),
            "response.cancel": (partial(_response_cancel, self), frozenset({"response_id"})),
        }
        """Each client event's handler and its fields (besides ``type`` and ``event_id``)."""

    # --- sending ------------------------------------------------------------------------

    async def emit(self, kind: str, **fields: Any) -> None:
        if self.closed:
            return
        await self._send({"type": kind, "event_id": _id("event"), **fields})

    async def error(self, exc: GatewayError, client_event: str | None = None) -> None:
        body = exc.body()["error"]
        await self.emit("error", error={**body, "event_id": client_event})

    # --- life ---------------------------------------------------------------------------

    async def start(self) -> None:
        """The connection is open: the session starts (and counts in the metrics)."""
        self._worker = asyncio.create_task(self._work())
        if self.services.metrics is not None:
            self.services.metrics.realtime_sessions.inc()
        await self.emit("session.created", session=self.config.to_json(self.id))

    async def close(self) -> None:
        """The connection is gone: stops the work in progress (and its Triton requests)
        and records the transcription requests not yet recorded."""
        if self.closed:
            return
        if self._worker is not None and self.services.metrics is not None:
            self.services.metrics.realtime_sessions.dec()
        self.closed = True
        for response in self.responses.values():
            if response.task is not None:
                response.task.cancel()
        self.turns._drop_early_transcription()
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for response in list(self.responses.values()):
            if response.speculation is not None:  # queued, never started
                response.speculation.drop()
        for speculation in list(self.speculations):
            await speculation.dropped()
        for request in list(self._transcriptions):
            await request.finish()

    async def _work(self) -> None:
        while True:
            job = await self._jobs.get()
            try:
                await job()
            except asyncio.CancelledError:
                if self.closed:
                    raise
            except GatewayError as exc:
                await self.error(exc)
            except Exception:
                logger.exception("realtime job failed")
                await self.error(GatewayError("The server had an error in this session."))

    def _check_room(self) -> None:
        if self._jobs.full():
            raise ClientEventError(
                f"The session already has {MAX_QUEUED_JOBS} transcriptions and responses "
                "waiting; wait for them to finish.",
                code="too_many_pending_jobs",
            )

    async def _admit(self, uses: list[_Use], record_refusal: bool = True) -> Admission:
        """A request of this session (a response, a transcription) admitted under the key's
        limits like any request, without a concurrency slot of its own (the connection
        holds one), its models checked against the key; the first one names it in usage
        and metrics. A 429 or 403 raises here (``record_refusal`` false: a 403 is not
        recorded in usage, for a request no client made)."""
        services = self.services
        admission = await self._admit_request()
        try:
            _require(admission.key, uses)
        except GatewayError:
            await services.finish(admission, record_refusal)
            raise
        admission.model = uses[0][0]
        return admission

    # --- client events ------------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> None:
        """Acts on one client event (the caller hands them over one at a time, in order);
        a bad one gets an ``error`` event, nothing more."""
        event_id = None
        try:
            limit = self.services.bounds.message_bytes
            if len(raw) > limit:
                raise ClientEventError(
                    f"The event is {len(raw):,} bytes; at most {limit:,} are allowed "
                    "(GATEWAY_REALTIME_MAX_MESSAGE_MB).",
                    code="message_too_large",
                )
            event = await _parse(raw, self.services.bounds.json_limits)
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ClientEventError(
                    "An event must be a JSON object with a 'type'.", param="type"
                )
            event_id = event.get("event_id")
            found = self._handlers.get(event["type"])
            if found is None:
                raise ClientEventError(
                    f"Unknown event type '{event['type']}'.", param="type", code="invalid_event"
                )
            handler, fields = found
            _fields(event, "", {"type", "event_id", *fields})
            await handler(event)
        except GatewayError as exc:
            await self.error(exc, event_id if isinstance(event_id, str) else None)

    async def _session_update(self, event: dict[str, Any]) -> None:
        spec = _object(event.get("session"), "session")
        config = await self.configurator._configured(self.config, spec)
        _require(self.key, _uses(config, self.speech_model))
        await self._apply(config)
        await self.emit("session.updated", session=config.to_json(self.id))

    async def _apply(self, config: SessionConfig) -> None:
        """Makes ``config`` the session's; new VAD settings start a new detector where the
        audio is now (the speech in progress, if any, is forgotten)."""
        if config.vad != self.config.vad:
            await self.turns._restart(config.vad)
        self.config = config

    async def _item_create(self, event: dict[str, Any]) -> None:
        conversation = self.conversation
        item, audio = await conversation._parse_item(_object(event.get("item"), "item"), "item")
        if any(existing.id == item.id for existing in conversation.items):
            raise ClientEventError(f"Item '{item.id}' already exists.", param="item.id")
        previous = event.get("previous_item_id")
        position = len(conversation.items)
        if previous == "root":
            position = 0
        elif previous:
            position = conversation._index(previous, "previous_item_id") + 1
        if audio is not None:
            self._check_room()
        prior = conversation.items[position - 1].id if position else None
        conversation.items.insert(position, item)
        await self.emit("conversation.item.added", item=item.to_json(), previous_item_id=prior)
        if audio is None:
            await self.emit("conversation.item.done", item=item.to_json())
        else:
            self._jobs.put_nowait(lambda: _transcribe_item(self, item, audio, None, None))
        await conversation._keep_bounded()

    async def _commit(
        self,
        item_id: str,
        audio: Audio,
        early: asyncio.Task[str | None] | None,
        turn: _Transcription | None,
    ) -> None:
        if self._jobs.full():
            if early is not None:
                early.cancel()
            if turn is not None:
                await turn.finish()
            self._check_room()
        items = self.conversation.items
        previous = items[-1].id if items else None
        item = Item(item_id, "user", [{"type": "input_audio", "transcript": None}], "completed")
        items.append(item)
        await self.emit("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)
        await self.emit("conversation.item.added", item=item.to_json(), previous_item_id=previous)
        self._jobs.put_nowait(lambda: _transcribe_item(self, item, audio, early, turn))
        await self.conversation._keep_bounded()
