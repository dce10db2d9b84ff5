"""A Realtime session: each client event parsed once (:func:`~.protocol.parse_event`) and
handed to the handler registered for its type, and :class:`RealtimeServices`, what every
session shares and the factory that opens one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway import tracing
from gateway.backend import Backend
from gateway.config import Settings
from gateway.errors import GatewayError
from gateway.metrics import Metrics
from gateway.serving.catalog import DefaultModels, ModelCatalog
from gateway.serving.chat import ChatService
from gateway.serving.realtime.audio_events import AudioEvents
from gateway.serving.realtime.context import Jobs, Services, SessionContext
from gateway.serving.realtime.conversation import Conversation
from gateway.serving.realtime.item_events import ItemEvents
from gateway.serving.realtime.items import Bounds, Use, require
from gateway.serving.realtime.protocol import (
    ClientEventError,
    SessionUpdate,
    new_id,
    parse_event,
    session_spec,
)
from gateway.serving.realtime.response_events import ResponseEvents
from gateway.serving.realtime.session_config import Configurator, SessionConfig
from gateway.serving.realtime.transcriber import Transcriber
from gateway.state.admission import Admission
from gateway.state.keys import ApiKey

Send = Callable[[dict[str, Any]], Awaitable[None]]

#: Model names of OpenAI's own (``gpt-realtime``, ``whisper-1``, ``gpt-4o-transcribe``...):
#: the gateway's default at connect, the session's model in a ``session.update``.
_OPENAI_MODEL_PREFIXES = ("gpt-", "whisper-")

#: Admits one more request of a session's caller under the key's limits as they are now,
#: without a concurrency slot of its own (the connection holds one): a 401 or 429 raises.
#: The API layer makes it from the key the connection presented, which the session never
#: sees.
Admit = Callable[[], Awaitable[Admission]]
#: Settles an admission once its request has ended: its tokens and usage (never raises).
Settle = Callable[[Admission, bool], Awaitable[None]]
#: A client event's handler.
Handler = Callable[[Any], Awaitable[None]]


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
        self.catalog = catalog
        self.models = models
        self.finish = finish
        self.metrics = metrics
        self.shared = Services(
            backend=backend,
            chat=chat,
            catalog=catalog,
            bounds=self.bounds,
            metrics=metrics,
            settle=self.settle,
            release=self.release,
            refuse=self.refuse,
        )

    async def model_for(
        self, task: str, requested: str | None, param: str, current: str | None = None
    ) -> str:
        """The model of ``task`` a session asked for: one of ours by name; for one of
        OpenAI's names (``gpt-realtime``, ``whisper-1``...) or none, the session's
        ``current`` one (a ``session.update``: the Agents SDK names ``gpt-realtime-2.1``
        in every update, which must not undo the ``?model=`` the session was opened
        with), else the default; a 404 (or a 400 for a model of another task) naming
        ``param`` for anything else."""
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
        return current or await self.models.pick(task)

    async def configure(
        self,
        requested_model: str | None,
        key: ApiKey,
        session: dict[str, Any] | None = None,
        intent: str | None = None,
    ) -> SessionConfig:
        """The settings a session of ``key`` starts with: the defaults for
        ``requested_model`` (a transcription session's for ``intent=transcription``), then
        ``session`` (a ``session.update``'s session, as a client secret holds it) applied.
        A refused field raises (a 400 naming it), and a model the key may not use a 403."""
        config, _ = await self._starting(requested_model, key, session, intent)
        return config

    async def _starting(
        self,
        requested_model: str | None,
        key: ApiKey,
        session: dict[str, Any] | None,
        intent: str | None,
    ) -> tuple[SessionConfig, str]:
        """:meth:`configure`'s settings, and the speech model they were checked with."""
        spec = session_spec(session) if session is not None else None
        transcribing = intent == "transcription" or (
            spec is not None and spec.type == "transcription"
        )
        if transcribing:  # ``?model=`` names its transcription model, if anything
            model = ""
            transcription_model = await self.model_for("transcription", requested_model, "model")
        else:
            model = await self.model_for("chat", requested_model, "model")
            transcription_model = await self.models.pick("transcription")
        info = await self.models.info("speech")
        config = SessionConfig(
            model=model,
            voice=info.voices[0] if info.voices else "alloy",
            transcription_model=transcription_model,
            kind="transcription" if transcribing else "realtime",
            instructions=self.settings.realtime_instructions,
            temperature=self.settings.realtime_temperature,
        )
        if spec is not None:
            configurator = Configurator(self.catalog, self.bounds, info.name, self.model_for)
            config = await configurator.configured(config, spec)
        require(key, config.uses(info.name))
        return config, info.name

    async def open(
        self,
        requested_model: str | None,
        key: ApiKey,
        admit: Admit,
        send: Send,
        session: dict[str, Any] | None = None,
        intent: str | None = None,
    ) -> RealtimeSession:
        """A session of ``key`` (403 unless it may use the models the session will), whose
        requests ``admit`` lets in, configured as :meth:`configure` says."""
        config, speech_model = await self._starting(requested_model, key, session, intent)
        return RealtimeSession(self, config, speech_model, key, admit, send)

    async def settle(self, admission: Admission) -> None:
        """Records what a session's request used (never raises)."""
        await self.finish(admission, True)
        if self.metrics is not None:
            self.metrics.record_usage(admission.usage())

    async def release(self, admission: Admission) -> None:
        """Ends a request of the gateway's own making (an answer made ahead and dropped):
        the key's limits count what it used, its usage does not (never raises)."""
        await self.finish(admission, False)

    async def refuse(self, admission: Admission) -> None:
        await self.finish(admission, True)


class RealtimeSession:
    """One connection's session: its handlers, by the event type each takes."""

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
        self.key = key
        """The key the session was opened with: ``session.update`` checks models against
        it. Each request is admitted with the key as it is then (:meth:`_admit`)."""
        self._admit_request = admit
        self._send = send
        self.id = new_id("sess")
        self.closed = False
        self.ctx = SessionContext(
            id=self.id,
            config=config,
            speech_model=speech_model,
            services=services.shared,
            emit=self.emit,
            error=self.error,
            jobs=Jobs(self.error),
            admit=self._admit,
        )
        self.configurator = Configurator(
            services.catalog, services.bounds, speech_model, services.model_for
        )
        self.conversation = Conversation(services.bounds, self.emit)
        self.transcriber = Transcriber(
            services.shared, self._admit, lambda: self.ctx.config, self.emit, self.error
        )
        self.responses = ResponseEvents(
            self.ctx, self.conversation, self.transcriber, self.configurator
        )
        self.item_events = ItemEvents(self.ctx, self.conversation, self.transcriber)
        self.audio = AudioEvents(self.ctx, self.item_events, self.responses, self.transcriber)
        self.handlers: dict[type[Any], Handler] = {
            SessionUpdate: self._session_update,
            **self.audio.handlers(),
            **self.item_events.handlers(),
            **self.responses.handlers(),
        }

    @property
    def config(self) -> SessionConfig:
        return self.ctx.config

    # --- sending ------------------------------------------------------------------------

    async def emit(self, kind: str, **fields: Any) -> None:
        if self.closed:
            return
        await self._send({"type": kind, "event_id": new_id("event"), **fields})

    async def error(self, exc: GatewayError, client_event: str | None = None) -> None:
        body = exc.body()["error"]
        await self.emit("error", error={**body, "event_id": client_event})

    # --- life ---------------------------------------------------------------------------

    async def start(self) -> None:
        """The connection is open: the session starts (and counts in the metrics)."""
        self.ctx.jobs.start()
        if self.services.metrics is not None:
            self.services.metrics.realtime_sessions.inc()
        await self.emit("session.created", session=self.config.to_json(self.id))

    async def close(self) -> None:
        """The connection is gone: stops the work in progress (and its Triton requests)
        and records the transcription requests not yet recorded."""
        if self.closed:
            return
        if self.ctx.jobs.started and self.services.metrics is not None:
            self.services.metrics.realtime_sessions.dec()
        self.closed = self.ctx.closed = True
        await self.responses.close()
        await self.audio.close()
        await self.ctx.jobs.stop()
        await self.responses.drop_ahead()
        await self.transcriber.close()

    async def _admit(self, uses: list[Use], record_refusal: bool = True) -> Admission:
        """A request of this session (a response, a transcription) admitted under the key's
        limits like any request, without a concurrency slot of its own (the connection
        holds one), its models checked against the key; the first one names it in usage
        and metrics. A 429 or 403 raises here (``record_refusal`` false: a 403 is not
        recorded in usage, for a request no client made)."""
        admission = await self._admit_request()
        try:
            require(admission.key, uses)
        except GatewayError:
            await self.services.finish(admission, record_refusal)
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
            event = await parse_event(raw, self.services.bounds.json_limits)
            event_id = event.event_id
            await self.handlers[type(event)](event)
        except ClientEventError as exc:
            await self.error(exc, event_id or exc.event_id)
        except GatewayError as exc:
            await self.error(exc, event_id)

    async def _session_update(self, event: SessionUpdate) -> None:
        config = await self.configurator.configured(self.config, event.session)
        require(self.key, config.uses(self.ctx.speech_model))
        await self.audio.reconfigure(config)
        self.ctx.config = config
        if "tracing" in event.session.model_fields_set:
            _trace_as(config.tracing)
        await self.emit("session.updated", session=config.to_json(self.id))


def _trace_as(setting: str | dict[str, Any] | None) -> None:
    """OpenAI's ``tracing`` names the session's trace (its workflow, group, metadata): here
    they go on the session's span (the WebSocket's), when tracing is on, as
    ``gateway.realtime.tracing.*`` attributes."""
    if setting is None:
        return
    values = {"mode": "auto"} if setting == "auto" else {"mode": "named"}
    if isinstance(setting, dict):
        for name in ("workflow_name", "group_id"):
            if setting.get(name):
                values[name] = str(setting[name])
        for key, value in (setting.get("metadata") or {}).items():
            values[f"metadata.{key}"] = str(value)
    tracing.annotate("gateway.realtime.tracing", values)
