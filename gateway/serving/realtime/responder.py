"""One response: admitted, generated from the conversation (or its own ``input``) with
the chat model, its function calls read out of the text by the model's tool-call parser
(the chat API's), its words spoken sentence by sentence, and its server events.

A response's output is a message (text, or audio with its transcript) and the function
calls the model made, each an item of its own, in the order the model wrote them; a call
is never spoken. The client runs a call and sends its output back
(``conversation.item.create`` of a ``function_call_output``), then asks for the next
response (``response.create``)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError
from gateway.serving import generation
from gateway.serving.chat import PreparedChat
from gateway.serving.g711 import G711Writer
from gateway.serving.protocol import ChatCompletionRequest
from gateway.serving.realtime.buffer import LAWS, Audio
from gateway.serving.realtime.context import AdmitUses, Emit, Services
from gateway.serving.realtime.conversation import Conversation
from gateway.serving.realtime.items import ANSWERS, SPEAKS, Item, Use
from gateway.serving.realtime.protocol import ClientEventError, new_id
from gateway.serving.realtime.session_config import format_json
from gateway.serving.realtime.speculation import Speculation, ask_of
from gateway.serving.realtime.transcriber import Transcriber
from gateway.serving.tool_parsers import ToolCallDelta
from gateway.serving.voice import Spoken, TextDelta, Voice, spoken
from gateway.state.admission import Admission


@dataclass
class Response:
    id: str
    model: str
    modalities: list[str]
    instructions: str
    max_output_tokens: int | None
    voice: Voice | None
    """Who speaks it (None: a text answer)."""
    output_format: str = "audio/pcm"
    temperature: float | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
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

    @property
    def calls_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def uses(self) -> list[Use]:
        """The models it uses, as the key must allow them."""
        uses = [(self.model, "session.model", ANSWERS)]
        if self.voice is not None:
            uses.append((self.voice.model, "response.output_modalities", SPEAKS))
        return uses

    def request(self, items: list[Item]) -> ChatCompletionRequest:
        """The chat request that answers ``items`` as this response asks."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        for item in items:
            _add_message(messages, item)
        if not any(m["role"] == "user" for m in messages):
            raise ClientEventError(
                "The conversation has no user message to respond to.",
                code="conversation_empty",
            )
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
        }
        if self.tools:
            choice = self.tool_choice
            if isinstance(choice, dict):
                choice = {"type": "function", "function": {"name": choice["name"]}}
            body |= {
                "tools": self.tools,
                "tool_choice": choice,
                "parallel_tool_calls": self.parallel_tool_calls,
            }
        return ChatCompletionRequest.model_validate(body)


def _add_message(messages: list[dict[str, Any]], item: Item) -> None:
    if item.type == "function_call":
        call = {
            "id": item.call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": item.arguments},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)  # parallel calls: one assistant message
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif item.type == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    elif text := item.text():
        messages.append({"role": item.role, "content": text})


class _Call:
    """A function call of the response, as the parser reads it."""

    def __init__(self, delta: ToolCallDelta, output_index: int) -> None:
        self.item = Item.call(new_id("item"), delta.id or "", delta.name or "", "", "in_progress")
        self.output_index = output_index


class Responder:
    """One response: admitted, generated, spoken, and its events."""

    def __init__(
        self,
        response: Response,
        services: Services,
        admit: AdmitUses,
        emit: Emit,
        error: Callable[[GatewayError], Awaitable[None]],
        conversation: Conversation,
        transcriber: Transcriber,
        session_id: str,
    ) -> None:
        self.response = response
        self.services = services
        self.admit = admit
        self.emit = emit
        self.error = error
        self.conversation = conversation
        self.transcriber = transcriber
        self.session_id = session_id
        self.outputs: list[Item] = []
        self.message: Item | None = None
        self.calls: list[_Call] = []
        self.text: list[str] = []
        self.audio_ms = 0.0
        self.status = "completed"
        self.details: dict[str, Any] | None = None
        self.generation_run: generation.GenerationRun | None = None
        self.speculation: Speculation | None = None
        """The turn's answer made ahead, while it may be this response's."""
        self.started = False
        """Admitted, and ``response.created`` sent: it will end with ``response.done``."""
        law = LAWS.get(response.output_format)
        self.encoder = G711Writer(law) if law is not None and response.voice else None

    def _json(self, status: str) -> dict[str, Any]:
        usage = None
        if self.generation_run is not None and status != "in_progress":
            prompt = self.generation_run.prompt_tokens
            completion = self.generation_run.completion_tokens
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
        voice = response.voice.voice if response.voice is not None else None
        return {
            "id": response.id,
            "object": "realtime.response",
            "status": status,
            "status_details": self.details,
            "output": [item.to_json() for item in self.outputs],
            "output_modalities": response.modalities,
            "conversation_id": self.session_id if response.conversation else None,
            "max_output_tokens": response.max_output_tokens or "inf",
            "audio": {"output": {"format": format_json(response.output_format), "voice": voice}},
            "usage": usage,
            "metadata": response.metadata,
        }

    def _where(self) -> dict[str, Any]:
        assert self.message is not None
        return {
            "response_id": self.response.id,
            "item_id": self.message.id,
            "output_index": self.outputs.index(self.message),
            "content_index": 0,
        }

    def _call_where(self, call: _Call) -> dict[str, Any]:
        """Where a call's argument events point (as :meth:`_where` for the message)."""
        return {
            "response_id": self.response.id,
            "item_id": call.item.id,
            "output_index": call.output_index,
            "call_id": call.item.call_id,
        }

    async def run(self) -> None:
        """Admits and makes the response, and sends its events up to its items' ``done``
        (:meth:`done` sends the last). Cancelled, it ends ``cancelled`` with what it had
        made, and the cancellation goes on up."""
        admission = await self._take_speculation()
        if admission is None:
            admission = await self.admit(self.response.uses(), True)
        self.started = True
        try:
            await self.emit("response.created", response=self._json("in_progress"))
            await self._generate(admission)
        except asyncio.CancelledError:
            self.status = "cancelled"
            self.details = {"type": "cancelled", "reason": self.response.reason}
            raise
        except GatewayError as exc:
            self.status = "failed"
            self.details = {"type": "failed", "error": exc.body()["error"]}
            await self.error(exc)
        finally:
            await asyncio.shield(self._finish(admission))

    async def _answered(self) -> list[Item]:
        """What the response answers: the conversation, or its ``input`` (whose audio is
        transcribed first, each part a transcription request of its own)."""
        if self.response.input is None:
            return list(self.conversation.items)
        for item, audio in self.response.input:
            if audio is not None:
                transcript = await self.transcriber.transcript(audio)
                item.content[item.audio_part()]["transcript"] = transcript
        return [item for item, _ in self.response.input]

    async def _generate(self, admission: Admission) -> None:
        response = self.response
        request = response.request(await self._answered())
        speculation = self.speculation
        chat: PreparedChat | None = None
        if speculation is not None and speculation.run is not None:
            self.generation_run = speculation.run
            made: AsyncGenerator[Any, None] = speculation.pieces()
        else:
            chat = await self.services.chat.prepare(request)
            self.generation_run = await self.services.chat.reserve_run(chat, admission.meter)
            made = await self._made(chat, admission)
        async with aclosing(made):
            if response.voice is None:
                async for text in made:
                    await self._add_text(text)
            else:
                await self._speak(made)
        if self.message is None and not self.calls:
            await self._start_message()  # the model said nothing: an empty answer
        if self.generation_run.finish_reasons.get(0) == "length":
            self.status = "incomplete"
            self.details = {"type": "incomplete", "reason": "max_output_tokens"}

    async def _made(self, chat: PreparedChat, admission: Admission) -> AsyncGenerator[Any, None]:
        """The answer's text pieces (audio: and its audio, as :func:`spoken` yields them),
        generated now, the function calls read out of them."""
        run = self.generation_run
        assert run is not None
        texts = generation.texts(await run.stream(), run, chat.reasoning())
        if chat.tools is not None:
            texts = self._without_calls(chat, texts)
        voice = self.response.voice
        if voice is None:
            return texts
        return spoken(self.services.backend, voice, texts, "pcm", admission.meter)

    async def _without_calls(
        self, chat: PreparedChat, texts: AsyncGenerator[str, None]
    ) -> AsyncGenerator[str, None]:
        """The content of ``texts``; the calls in them become function call items. (The
        message's item is started here, with its first text, so that the output items are
        in the order the model wrote them, although a spoken text reaches :meth:`_speak`
        later than the calls after it.)"""
        assert chat.tools is not None
        parser = chat.tools.new_parser()
        async with aclosing(texts):
            async for text in texts:
                told = parser.feed(text)
                if told.content.strip() and self.message is None:
                    await self._start_message()
                await self._call_pieces(told.calls)
                if told.content and self.message is not None:  # (blank text around calls: none)
                    yield told.content
                if parser.closed:  # parallel_tool_calls false: one call, the rest dropped
                    break
        told = parser.finish()
        if told.content.strip() and self.message is None:
            await self._start_message()
        await self._call_pieces(told.calls)
        if told.content and self.message is not None:
            yield told.content
        await self._end_call()

    async def _call_pieces(self, pieces: list[ToolCallDelta]) -> None:
        for piece in pieces:
            if piece.name is not None:
                await self._end_call()
                call = _Call(piece, len(self.outputs))
                self.calls.append(call)
                await self._add_output(call.item)
            call = self.calls[-1]
            if piece.arguments:
                call.item.arguments += piece.arguments
                await self.emit(
                    "response.function_call_arguments.delta",
                    delta=piece.arguments,
                    **self._call_where(call),
                )

    async def _end_call(self, status: str = "completed") -> None:
        call = self.calls[-1] if self.calls else None
        if call is None or call.item.status != "in_progress":
            return
        call.item.status = status
        await self.emit(
            "response.function_call_arguments.done",
            name=call.item.name,
            arguments=call.item.arguments,
            **self._call_where(call),
        )
        await self._output_done(call.item)

    async def _add_output(self, item: Item) -> None:
        self.outputs.append(item)
        await self.emit(
            "response.output_item.added",
            response_id=self.response.id,
            output_index=len(self.outputs) - 1,
            item=item.to_json(),
        )
        if self.response.conversation:
            await self.conversation.append(item)
            await self.conversation.keep_bounded()

    async def _output_done(self, item: Item) -> None:
        await self.emit(
            "response.output_item.done",
            response_id=self.response.id,
            output_index=self.outputs.index(item),
            item=item.to_json(),
        )
        if self.response.conversation:
            await self.emit("conversation.item.done", item=item.to_json())
            await self.conversation.keep_bounded()

    async def _start_message(self) -> None:
        audio = self.response.voice is not None
        self.message = Item(new_id("item"), "assistant", [], "in_progress")
        self.message.content = [
            {"type": "output_audio", "transcript": ""}
            if audio
            else {"type": "output_text", "text": ""}
        ]
        await self._add_output(self.message)
        part = {"type": "audio", "transcript": ""} if audio else {"type": "text", "text": ""}
        await self.emit("response.content_part.added", part=part, **self._where())

    async def _add_text(self, text: str) -> None:
        if self.message is None:
            await self._start_message()
        assert self.message is not None
        self.text.append(text)
        audio = self.response.voice is not None
        self.message.content[0]["transcript" if audio else "text"] = "".join(self.text)
        kind = "response.output_audio_transcript.delta" if audio else "response.output_text.delta"
        await self.emit(kind, delta=text, **self._where())

    async def _take_speculation(self) -> Admission | None:
        """The admission of the turn's answer made ahead, which this response takes if it
        asks exactly what was guessed; None otherwise (it is dropped)."""
        speculation, self.response.speculation = self.response.speculation, None
        if speculation is None:
            return None
        response = self.response
        ask = None
        if response.conversation and response.input is None and not response.calls_tools:
            try:
                request = response.request(list(self.conversation.items))
            except ClientEventError:
                request = None
            if request is not None:
                ask = ask_of(request, response.voice)
        if ask is None:
            await speculation.dropped()  # its tpm reservation released before ours
            return None
        admission = await speculation.take(ask)
        if admission is not None:
            self.speculation = speculation
        return admission

    async def _speak(self, stream: AsyncGenerator[Spoken, None]) -> None:
        async for piece in stream:
            if isinstance(piece, TextDelta):
                await self._add_text(piece.text)
                continue
            if self.message is None:
                await self._start_message()
            assert self.message is not None
            if not self.message.spoken:
                self._first_audio()
            if piece.seconds and (
                not self.message.spoken or self.message.spoken[-1][1] != piece.sentence
            ):
                self.message.spoken.append((round(self.audio_ms), piece.sentence))
            self.audio_ms += piece.seconds * 1000
            data = self.encoder.write(piece.data) if self.encoder is not None else piece.data
            if data:
                delta = base64.b64encode(data).decode()
                await self.emit("response.output_audio.delta", delta=delta, **self._where())

    def _first_audio(self) -> None:
        metrics = self.services.metrics
        if metrics is not None and self.response.turn_ended is not None:
            metrics.realtime_first_audio.observe(time.monotonic() - self.response.turn_ended)

    async def _finish(self, admission: Admission) -> None:
        services = self.services
        if self.speculation is not None:  # taken: what it used is this response's
            await self.speculation.dropped()  # stopped, all it used counted, before settling
        await services.settle(admission)
        if services.metrics is not None:
            services.metrics.realtime_responses.labels(admission.model, self.status).inc()
        done = "completed" if self.status == "completed" else "incomplete"
        await self._end_call(done)
        if self.message is not None:
            await self._end_message(done)

    async def _end_message(self, status: str) -> None:
        assert self.message is not None
        self.message.status = status
        where = self._where()
        text = "".join(self.text)
        if self.response.voice is not None:
            if self.encoder is not None and (rest := self.encoder.flush()):
                delta = base64.b64encode(rest).decode()
                await self.emit("response.output_audio.delta", delta=delta, **where)
            await self.emit("response.output_audio.done", **where)
            await self.emit("response.output_audio_transcript.done", transcript=text, **where)
            part = {"type": "audio", "transcript": text}
        else:
            await self.emit("response.output_text.done", text=text, **where)
            part = {"type": "text", "text": text}
        await self.emit("response.content_part.done", part=part, **where)
        await self._output_done(self.message)

    async def done(self) -> None:
        """The last event: ``response.done`` (sent once the response is no longer active)."""
        await self.emit("response.done", response=self._json(self.status))
