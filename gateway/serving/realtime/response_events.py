"""A session's responses: ``response.create`` and ``response.cancel``, the response a
spoken turn gets, barge-in, and the answer to a guessed turn started ahead. Responses run
on the session's work queue; the conversation's one at a time (out-of-band ones, with
``conversation: "none"``, also while it runs)."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.trace import Span

from gateway import tracing
from gateway.serving.realtime.context import SessionContext
from gateway.serving.realtime.conversation import Conversation
from gateway.serving.realtime.items import Item
from gateway.serving.realtime.protocol import (
    ClientEventError,
    ResponseCancel,
    ResponseCreate,
    new_id,
)
from gateway.serving.realtime.responder import Responder, Response
from gateway.serving.realtime.session_config import (
    Configurator,
    chat_tool,
    check_tools,
    choice,
    tokens,
)
from gateway.serving.realtime.specs import ResponseSpec
from gateway.serving.realtime.speculation import Speculation
from gateway.serving.realtime.transcriber import Transcriber
from gateway.serving.voice import Voice


class ResponseEvents:
    """The responses of one session, queued or running."""

    def __init__(
        self,
        ctx: SessionContext,
        conversation: Conversation,
        transcriber: Transcriber,
        configurator: Configurator,
    ) -> None:
        self.ctx = ctx
        self.conversation = conversation
        self.transcriber = transcriber
        self.configurator = configurator
        self.active: Response | None = None
        """The conversation's response, queued or running (one at a time)."""
        self.running: dict[str, Response] = {}
        """Every response queued or running, out-of-band ones included."""
        self.speculations: set[Speculation] = set()
        """Answers made ahead not yet dropped (see speculation.py): at most one is held by
        the session's turn or its response; the set makes sure none outlives the session."""

    def handlers(self) -> dict[type[Any], Any]:
        return {ResponseCreate: self.create, ResponseCancel: self.cancel}

    # --- client events ------------------------------------------------------------------

    async def create(self, event: ResponseCreate) -> None:
        self._answering("response.create")
        self.ctx.jobs.check_room()  # before its input's audio is decoded
        response = await self.new(event.response)
        if response.conversation and self.active is not None:
            raise ClientEventError(
                f"Conversation already has an active response in progress: "
                f"{self.active.id}. Wait until the response is finished before creating "
                "a new one.",
                code="conversation_already_has_active_response",
            )
        self.queue(response, None)

    async def cancel(self, event: ResponseCancel) -> None:
        self._answering("response.cancel")
        wanted = event.response_id
        response = self.active if wanted is None else self.running.get(wanted)
        if response is None:
            raise ClientEventError(
                "Cancellation failed: no active response found.",
                param=None if wanted is None else "response_id",
                code="response_cancel_not_active",
            )
        self._cancel(response, "client_cancelled")

    def _answering(self, kind: str) -> None:
        if not self.ctx.config.answers:
            raise ClientEventError(
                f"A transcription session makes no responses: '{kind}' is not taken.",
                param="type",
                code="invalid_event",
            )

    # --- responses ----------------------------------------------------------------------

    async def new(self, spec: ResponseSpec | None) -> Response:
        """A response as ``spec`` (a ``response.create``'s response) asks, the session's
        settings for what it leaves out."""
        config = self.ctx.config
        spec = spec or ResponseSpec()
        given = spec.model_fields_set
        modalities = list(spec.output_modalities or config.output_modalities)
        max_tokens = config.max_output_tokens
        if "max_output_tokens" in given:
            max_tokens = tokens(spec.max_output_tokens)
        instructions = config.instructions
        if spec.instructions is not None:
            instructions = self.configurator.kept(spec.instructions, "response.instructions")
        voice, output_format = config.voice, config.output_format
        output = spec.audio.output if spec.audio is not None else None
        if output is not None and output.voice is not None:
            voice = await self.configurator.voice(output.voice, "response.audio.output.voice")
        if output is not None and output.format is not None:
            output_format = output.format.type
        tools = config.tools
        if spec.tools is not None:
            tools = [chat_tool(tool.model_dump()) for tool in spec.tools]
        tool_choice = (
            choice(spec.tool_choice) if spec.tool_choice is not None else config.tool_choice
        )
        check_tools(tools, tool_choice, "response", self.ctx.services.bounds)
        inputs = None
        if spec.input is not None:
            inputs = await self.conversation.inputs(spec.input, config.input_format)
        speaker = Voice(self.ctx.speech_model, voice, config.speed)
        return Response(
            id=new_id("resp"),
            model=config.model,
            modalities=modalities,
            instructions=instructions,
            max_output_tokens=max_tokens,
            voice=speaker if modalities == ["audio"] else None,
            output_format=output_format,
            temperature=config.temperature,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=(
                spec.parallel_tool_calls
                if spec.parallel_tool_calls is not None
                else config.parallel_tool_calls
            ),
            conversation=spec.conversation != "none",
            input=inputs,
            metadata=spec.metadata,
        )

    def queue(self, response: Response, turn_ended: float | None) -> None:
        if response.conversation and self.active is not None:
            self._forget(response)
            return  # one at a time; a VAD turn during a response that went on is heard next
        try:
            self.ctx.jobs.check_room()
        except ClientEventError:
            self._forget(response)
            raise
        response.turn_ended = turn_ended
        if response.conversation:
            self.active = response
        self.running[response.id] = response
        self.ctx.jobs.put(lambda: self._run(response))

    async def for_turn(self, speculation: Speculation | None, turn_ended: float) -> None:
        """The response a spoken turn gets (``create_response``): it takes the answer made
        ahead, or drops it if it asks otherwise (or never starts)."""
        response = None
        try:
            response = await self.new(None)
        finally:
            if speculation is not None and response is None:
                speculation.drop()
        response.speculation = speculation
        self.queue(response, turn_ended)

    async def ahead(self, transcript: str) -> Speculation | None:
        """The answer a turn ending on ``transcript`` would get, started now (none when
        the session calls tools: an answer made ahead is not read for calls)."""
        config = self.ctx.config
        if self.active is not None or self.ctx.closed or not config.create_response:
            return None
        if not config.answers:  # a transcription session answers nothing
            return None
        response = await self.new(None)
        if response.calls_tools:
            return None
        guessed = Item(new_id("item"), "user", [{"type": "input_audio", "transcript": transcript}])
        request = response.request([*self.conversation.items, guessed])
        services = self.ctx.services
        return Speculation(
            services, self.ctx.admit, request, response.voice, response.uses(), self.speculations
        )

    def interrupt(self) -> None:
        """Barge-in: the conversation's response is cancelled (``turn_detected``)."""
        if self.ctx.config.interrupt_response and self.active is not None:
            self._cancel(self.active, "turn_detected")

    def _cancel(self, response: Response, reason: str) -> None:
        response.reason = reason
        if response.task is not None:
            response.task.cancel()
        else:
            self._forget(response)  # queued, not started: it never begins

    def _forget(self, response: Response) -> None:
        self.running.pop(response.id, None)
        if self.active is response:
            self.active = None
        if response.speculation is not None:  # it never started: its answer made ahead goes
            response.speculation.drop()
            response.speculation = None

    async def _run(self, response: Response) -> None:
        if self.running.get(response.id) is not response:
            self._forget(response)
            return
        response.task = asyncio.current_task()
        ctx = self.ctx
        responder = Responder(
            response,
            ctx.services,
            ctx.admit,
            ctx.emit,
            ctx.error,
            self.conversation,
            self.transcriber,
            ctx.id,
        )
        try:
            # Traced: a span per response, under the session's (the WebSocket's) span.
            attributes = {"gen_ai.request.model": response.model}
            with tracing.span("realtime.response", attributes) as traced:
                try:
                    await responder.run()
                except asyncio.CancelledError:
                    if ctx.closed:
                        raise
                finally:
                    if traced is not None:
                        _traced(traced, responder)
        finally:
            # No longer active once the client can read that it is done: a response.create
            # sent on reading response.done must not find it still running.
            self._forget(response)
        if responder.started:
            await responder.done()

    async def close(self) -> None:
        """The session is closing: its responses stop (their Triton requests with them)."""
        for response in self.running.values():
            if response.task is not None:
                response.task.cancel()

    async def drop_ahead(self) -> None:
        """The answers made ahead that no response took are dropped and released."""
        for response in list(self.running.values()):
            if response.speculation is not None:  # queued, never started
                response.speculation.drop()
        for speculation in list(self.speculations):
            await speculation.dropped()


def _traced(span: Span, responder: Responder) -> None:
    span.set_attribute("gateway.realtime.status", responder.status)
    outcome = {"failed": "error", "cancelled": "cancelled"}.get(responder.status, "ok")
    span.set_attribute("gateway.outcome", outcome)
    run = responder.generation_run
    if run is not None:
        span.set_attribute("gen_ai.usage.input_tokens", run.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", run.completion_tokens)
