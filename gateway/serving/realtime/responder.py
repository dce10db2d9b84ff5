"""A session's responses: built from a ``response.create`` (or for a turn), queued on the
session's work (the conversation's one at a time), cancelled; and one response admitted,
generated from the conversation (or its own ``input``) with the chat model, spoken
sentence by sentence, and its server events."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

from gateway import tracing
from gateway.errors import GatewayError
from gateway.serving import generation
from gateway.serving.chat import PreparedChat
from gateway.serving.protocol import ChatCompletionRequest
from gateway.serving.realtime.buffer import Audio
from gateway.serving.realtime.events import (
    _ANSWERS,
    _RESPONSE_FIELDS,
    _SPEAKS,
    PCM_FORMAT,
    ClientEventError,
    Item,
    _check_format,
    _fields,
    _id,
    _max_tokens,
    _metadata,
    _modalities,
    _object,
    _refuse_tools,
    _Use,
)
from gateway.serving.realtime.speculation import Speculation, ask_of
from gateway.serving.realtime.transcription import _transcript
from gateway.serving.voice import Spoken, TextDelta, Voice, spoken
from gateway.state.admission import Admission

if TYPE_CHECKING:
    from gateway.serving.realtime.session import RealtimeSession


@dataclass
class Response:
    id: str
    model: str
    modalities: list[str]
    instructions: str
    max_output_tokens: int | None
    voice: str
    conversation: bool = True
    """False for an out-of-band response (``conversation: "none"``): its answer is not
    added to the conversation, and it may be asked for while the conversation's own runs
    (it runs next: a session's work runs in order)."""
    input: list[tuple[Item, Audio | None]] | None = None
    """The items it answers instead of the conversation (``input``), with the audio of
    those still to transcribe."""
    metadata: dict[str, str] | None = None
    reason: str = "client_cancelled"
    """Why it was cancelled, if it is (``turn_detected`` for barge-in)."""
    task: asyncio.Task[None] | None = None
    turn_ended: float | None = None
    """When the user's turn ended (monotonic), for the first-audio latency metric."""
    speculation: Speculation | None = None
    """The answer of its turn made ahead, held until it starts (see speculation.py)."""


async def _new_response(session: RealtimeSession, spec: dict[str, Any]) -> Response:
    """A response as ``spec`` (a ``response.create``'s response) asks, the session's
    settings for what it leaves out."""
    _fields(spec, "response", _RESPONSE_FIELDS)
    _refuse_tools(spec, "response")
    conversation = spec.get("conversation") or "auto"
    if conversation not in ("auto", "none"):
        raise ClientEventError(
            "conversation must be 'auto' or 'none'.", param="response.conversation"
        )
    modalities = session.config.output_modalities
    if spec.get("output_modalities") is not None:
        modalities = _modalities(spec["output_modalities"], "response.output_modalities")
    max_tokens = session.config.max_output_tokens
    if "max_output_tokens" in spec:
        max_tokens = _max_tokens(spec["max_output_tokens"], "response.max_output_tokens")
    instructions = session.config.instructions
    if spec.get("instructions") is not None:
        instructions = session.configurator._kept(spec["instructions"], "response.instructions")
    audio = _object(spec.get("audio") or {}, "response.audio")
    _fields(audio, "response.audio", {"output"})
    output = _object(audio.get("output") or {}, "response.audio.output")
    _fields(output, "response.audio.output", {"format", "voice"})
    _check_format(output.get("format"), "response.audio.output.format")
    voice = session.config.voice
    if output.get("voice") is not None:
        voice = await session.configurator._voice(output["voice"], "response.audio.output.voice")
    inputs = None
    if spec.get("input") is not None:
        inputs = await session.conversation._inputs(spec["input"])
    return Response(
        id=_id("resp"),
        model=session.config.model,
        modalities=modalities,
        instructions=instructions,
        max_output_tokens=max_tokens,
        voice=voice,
        conversation=conversation == "auto",
        input=inputs,
        metadata=_metadata(spec.get("metadata"), "response.metadata"),
    )


def response_uses(session: RealtimeSession, response: Response) -> list[_Use]:
    """The models ``response`` uses, as the key must allow them."""
    uses = [(response.model, "session.model", _ANSWERS)]
    if response.modalities == ["audio"]:
        uses.append((session.speech_model, "response.output_modalities", _SPEAKS))
    return uses


def chat_request(
    session: RealtimeSession, response: Response, items: list[Item]
) -> ChatCompletionRequest:
    """The chat request that answers ``items`` as ``response`` asks."""
    messages: list[dict[str, Any]] = []
    if response.instructions:
        messages.append({"role": "system", "content": response.instructions})
    for item in items:
        text = item.text()
        if text:
            messages.append({"role": item.role, "content": text})
    if not any(m["role"] == "user" for m in messages):
        raise ClientEventError(
            "The conversation has no user message to respond to.",
            code="conversation_empty",
        )
    return ChatCompletionRequest.model_validate(
        {
            "model": response.model,
            "messages": messages,
            "max_tokens": response.max_output_tokens,
            "temperature": session.config.temperature,
        }
    )


class _Responder:
    """One response: admitted, generated, spoken, and its events."""

    def __init__(self, session: RealtimeSession, response: Response) -> None:
        self.session = session
        self.response = response
        self.audio = response.modalities == ["audio"]
        self.item = Item(_id("item"), "assistant", [], "in_progress")
        self.text: list[str] = []
        self.audio_ms = 0.0
        self.status = "completed"
        self.details: dict[str, Any] | None = None
        self.generation_run: generation.GenerationRun | None = None
        self.started = False
        self.speculation: Speculation | None = None
        """The turn's answer made ahead, while it may be this response's."""

    def _json(self, status: str) -> dict[str, Any]:
        usage = None
        if self.generation_run is not None and status != "in_progress":
            prompt, completion = (
                self.generation_run.prompt_tokens,
                self.generation_run.completion_tokens,
            )
            usage = {
                "total_tokens": prompt + completion,
                "input_tokens": prompt,
                "output_tokens": completion,
                "input_token_details": {
                    "text_tokens": prompt,
                    "audio_tokens": 0,
                    "cached_tokens": 0,
                },
                "output_token_details": {"text_tokens": completion, "audio_tokens": 0},
            }
        response = self.response
        return {
            "id": response.id,
            "object": "realtime.response",
            "status": status,
            "status_details": self.details,
            "output": [self.item.to_json()] if self.started else [],
            "output_modalities": response.modalities,
            "conversation_id": self.session.id if response.conversation else None,
            "max_output_tokens": response.max_output_tokens or "inf",
            "audio": {"output": {"format": PCM_FORMAT, "voice": response.voice}},
            "usage": usage,
            "metadata": response.metadata,
        }

    def _where(self) -> dict[str, Any]:
        return {
            "response_id": self.response.id,
            "item_id": self.item.id,
            "output_index": 0,
            "content_index": 0,
        }

    async def run(self) -> None:
        session = self.session
        admission = await self._take_speculation()
        if admission is None:
            admission = await session._admit(response_uses(session, self.response))
        try:
            await session.emit("response.created", response=self._json("in_progress"))
            await self._generate(admission)
        except asyncio.CancelledError:
            if session.closed:
                raise
            self.status = "cancelled"
            self.details = {"type": "cancelled", "reason": self.response.reason}
        except GatewayError as exc:
            self.status = "failed"
            self.details = {"type": "failed", "error": exc.body()["error"]}
            await session.error(exc)
        finally:
            await asyncio.shield(self._finish(admission))

    async def _answered(self) -> list[Item]:
        """What the response answers: the conversation, or its ``input`` (whose audio is
        transcribed first, each part a transcription request of its own)."""
        if self.response.input is None:
            return list(self.session.conversation.items)
        for item, audio in self.response.input:
            if audio is not None:
                transcript = await _transcript(self.session, audio)
                item.content[item.audio_part()]["transcript"] = transcript
        return [item for item, _ in self.response.input]

    async def _generate(self, admission: Admission) -> None:
        session = self.session
        response = self.response
        request = chat_request(session, response, await self._answered())
        speculation = self.speculation
        made: AsyncGenerator[Any, None]
        if speculation is not None and speculation.run is not None:
            self.generation_run = speculation.run
            made = speculation.pieces()
        else:
            chat = await session.services.chat.prepare(request)
            self.generation_run = await session.services.chat.reserve_run(chat, admission.meter)
            made = await self._made(chat, admission)
        self.started = True
        part = {"type": "audio", "transcript": ""} if self.audio else {"type": "text", "text": ""}
        self.item.content = [
            {"type": "output_audio", "transcript": ""}
            if self.audio
            else {"type": "output_text", "text": ""}
        ]
        await session.emit(
            "response.output_item.added",
            response_id=response.id,
            output_index=0,
            item=self.item.to_json(),
        )
        if response.conversation:
            items = session.conversation.items
            previous = items[-1].id if items else None
            items.append(self.item)
            await session.emit(
                "conversation.item.added", item=self.item.to_json(), previous_item_id=previous
            )
            await session.conversation._keep_bounded()
        await session.emit("response.content_part.added", part=part, **self._where())
        if not self.audio:
            async with aclosing(made):
                async for text in made:
                    self._add_text(text)
                    await session.emit("response.output_text.delta", delta=text, **self._where())
        else:
            await self._speak(made)
        if self.generation_run.finish_reasons.get(0) == "length":
            self.status = "incomplete"
            self.details = {"type": "incomplete", "reason": "max_output_tokens"}

    async def _made(self, chat: PreparedChat, admission: Admission) -> AsyncGenerator[Any, None]:
        """The answer's text pieces (audio: and its audio, as :func:`spoken` yields them),
        generated now."""
        run = self.generation_run
        assert run is not None
        texts = generation.texts(await run.stream(), run, chat.reasoning())
        if not self.audio:
            return texts
        session = self.session
        voice = Voice(session.speech_model, self.response.voice, session.config.speed)
        return spoken(session.services.backend, voice, texts, "pcm", admission.meter)

    async def _take_speculation(self) -> Admission | None:
        """The admission of the turn's answer made ahead, which this response takes if it
        asks exactly what was guessed; None otherwise (it is dropped)."""
        speculation, self.response.speculation = self.response.speculation, None
        if speculation is None:
            return None
        session, response = self.session, self.response
        ask = None
        if response.conversation and response.input is None:
            try:
                request = chat_request(session, response, list(session.conversation.items))
            except ClientEventError:
                request = None
            if request is not None:
                ask = ask_of(session, request, response.voice, self.audio)
        if ask is None:
            await speculation.dropped()  # its tpm reservation released before ours
            return None
        admission = await speculation.take(ask)
        if admission is not None:
            self.speculation = speculation
        return admission

    async def _speak(self, stream: AsyncGenerator[Spoken, None]) -> None:
        session = self.session
        async with aclosing(stream):
            async for piece in stream:
                if isinstance(piece, TextDelta):
                    self._add_text(piece.text)
                    await session.emit(
                        "response.output_audio_transcript.delta", delta=piece.text, **self._where()
                    )
                    continue
                if not self.item.spoken:
                    self._first_audio()
                if piece.seconds and (
                    not self.item.spoken or self.item.spoken[-1][1] != piece.sentence
                ):
                    self.item.spoken.append((round(self.audio_ms), piece.sentence))
                self.audio_ms += piece.seconds * 1000
                if piece.data:
                    await session.emit(
                        "response.output_audio.delta",
                        delta=base64.b64encode(piece.data).decode(),
                        **self._where(),
                    )

    def _first_audio(self) -> None:
        metrics = self.session.services.metrics
        if metrics is not None and self.response.turn_ended is not None:
            metrics.realtime_first_audio.observe(time.monotonic() - self.response.turn_ended)

    def _add_text(self, text: str) -> None:
        self.text.append(text)
        key = "transcript" if self.audio else "text"
        self.item.content[0][key] = "".join(self.text)

    async def _finish(self, admission: Admission) -> None:
        session = self.session
        services = session.services
        if self.speculation is not None:  # taken: what it used is this response's
            await self.speculation.dropped()  # stopped, all it used counted, before settling
        await services.settle(admission)
        if services.metrics is not None:
            services.metrics.realtime_responses.labels(admission.model, self.status).inc()
        if self.started:
            self.item.status = "completed" if self.status == "completed" else "incomplete"
            where = self._where()
            text = "".join(self.text)
            if self.audio:
                await session.emit("response.output_audio.done", **where)
                await session.emit(
                    "response.output_audio_transcript.done", transcript=text, **where
                )
                part = {"type": "audio", "transcript": text}
            else:
                await session.emit("response.output_text.done", text=text, **where)
                part = {"type": "text", "text": text}
            await session.emit("response.content_part.done", part=part, **where)
            await session.emit(
                "response.output_item.done",
                response_id=self.response.id,
                output_index=0,
                item=self.item.to_json(),
            )
            if self.response.conversation:
                await session.emit("conversation.item.done", item=self.item.to_json())
                await session.conversation._keep_bounded()
        # No longer active once the client can read that it is done: a response.create
        # sent on reading response.done must not find it still running.
        _forget(session, self.response)
        await session.emit("response.done", response=self._json(self.status))


async def _response_create(session: RealtimeSession, event: dict[str, Any]) -> None:
    response = await _new_response(session, _object(event.get("response") or {}, "response"))
    if response.conversation and session.response is not None:
        raise ClientEventError(
            f"Conversation already has an active response in progress: "
            f"{session.response.id}. Wait until the response is finished before creating "
            "a new one.",
            code="conversation_already_has_active_response",
        )
    _queue_response(session, response, None)


def _queue_response(session: RealtimeSession, response: Response, turn_ended: float | None) -> None:
    if response.conversation and session.response is not None:
        _forget(session, response)
        return  # one at a time; a VAD turn during a response that went on is heard next
    try:
        session._check_room()
    except ClientEventError:
        _forget(session, response)
        raise
    response.turn_ended = turn_ended
    if response.conversation:
        session.response = response
    session.responses[response.id] = response
    session._jobs.put_nowait(lambda: _run_response(session, response))


async def _response_cancel(session: RealtimeSession, event: dict[str, Any]) -> None:
    wanted = event.get("response_id")
    response = session.response if wanted is None else session.responses.get(wanted)
    if response is None:
        raise ClientEventError(
            "Cancellation failed: no active response found.",
            param=None if wanted is None else "response_id",
            code="response_cancel_not_active",
        )
    _cancel(session, response, "client_cancelled")


def _cancel(session: RealtimeSession, response: Response, reason: str) -> None:
    response.reason = reason
    if response.task is not None:
        response.task.cancel()
    else:
        _forget(session, response)  # queued, not started: it never begins


def _forget(session: RealtimeSession, response: Response) -> None:
    session.responses.pop(response.id, None)
    if session.response is response:
        session.response = None
    if response.speculation is not None:  # it never started: its answer made ahead goes
        response.speculation.drop()
        response.speculation = None


async def _run_response(session: RealtimeSession, response: Response) -> None:
    if session.responses.get(response.id) is not response:
        _forget(session, response)
        return
    response.task = asyncio.current_task()
    responder = _Responder(session, response)
    try:
        # Traced: a span per response, under the session's (the WebSocket's) span.
        with tracing.span("realtime.response", {"gen_ai.request.model": response.model}) as traced:
            try:
                await responder.run()
            finally:
                if traced is not None:
                    _traced(traced, responder)
    finally:
        _forget(session, response)


def _traced(span: Span, responder: _Responder) -> None:
    span.set_attribute("gateway.realtime.status", responder.status)
    outcome = {"failed": "error", "cancelled": "cancelled"}.get(responder.status, "ok")
    span.set_attribute("gateway.outcome", outcome)
    run = responder.generation_run
    if run is not None:
        span.set_attribute("gen_ai.usage.input_tokens", run.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", run.completion_tokens)
