"""Chat completions: OpenAI request in, backend generation, OpenAI response or SSE out.

Streaming follows the OpenAI wire format: every chunk has the same ``id`` and ``created``,
the first delta carries the role, the last one ``finish_reason``, an optional usage chunk
(``stream_options.include_usage``) comes before ``data: [DONE]``, which is always sent.
The first backend chunk is awaited before the HTTP response starts, so a request that fails
up front (Triton down, the model rejects it) gets a real error status; a failure after that
is sent as an SSE ``error`` event followed by ``[DONE]``. Closing the stream (the client
went away) closes the backend iterator, which cancels the request in Triton.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from gateway.backend import Backend, GenerationChunk, SamplingOptions
from gateway.errors import InvalidRequestError
from gateway.metrics import ChatTimer, Metrics
from gateway.serving.catalog import ModelCatalog
from gateway.serving.protocol import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatMessage,
    Usage,
)
from gateway.serving.sse import first_or_close, with_error_event
from gateway.serving.templating import render_chat
from gateway.state.limits import Meter
from gateway.state.sessions import SessionPlan, SessionStore, plan

logger = logging.getLogger("gateway.serving.chat")


@dataclass(frozen=True)
class PreparedChat:
    """A validated request, ready for the backend."""

    id: str
    created: int
    model: str
    prompt: str
    options: SamplingOptions
    include_usage: bool
    session: SessionPlan | None = None
    """Set when the request continues a session: the reply is stored when it completes."""
    started: float = field(default_factory=time.monotonic)


def _message_text(index: int, message: ChatMessage) -> str:
    if message.content is None:
        raise InvalidRequestError(
            "Messages without content (tool calls) are not supported.",
            param=f"messages.[{index}].content",
        )
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if part.type != "text":
            raise InvalidRequestError(
                f"Content parts of type '{part.type}' are not supported; only 'text' is.",
                param=f"messages.[{index}].content",
            )
        if part.text is None:
            raise InvalidRequestError(
                "A content part of type 'text' needs a 'text' field.",
                param=f"messages.[{index}].content",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _template_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    rendered = []
    for index, message in enumerate(messages):
        if message.role in ("tool", "function"):
            raise InvalidRequestError(
                f"Messages with role '{message.role}' are not supported (no tool calling).",
                param=f"messages.[{index}].role",
            )
        # "developer" is the newer name of "system"; chat templates know "system".
        role = "system" if message.role == "developer" else message.role
        rendered.append({"role": role, "content": _message_text(index, message)})
    return rendered


def sampling_options(request: ChatCompletionRequest) -> SamplingOptions:
    """OpenAI parameters -> vLLM sampling parameters."""
    temperature, top_p = request.temperature, request.top_p
    if top_p == 0.0:
        # OpenAI accepts top_p=0 (keep only the likeliest token); engines want top_p > 0.
        temperature, top_p = 0.0, None
    return SamplingOptions(
        max_tokens=request.max_completion_tokens or request.max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=request.seed,
        stop=request.stop_list(),
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
    )


class _ChunkWriter:
    """Serializes stream chunks. Only the delta changes from chunk to chunk, so the fixed
    parts are encoded once: this runs once per token on the hot path."""

    def __init__(self, chat: PreparedChat) -> None:
        head = {
            "id": chat.id,
            "object": "chat.completion.chunk",
            "created": chat.created,
            "model": chat.model,
            "system_fingerprint": None,
        }
        self._prefix = "data: " + json.dumps(head)[:-1] + ',"choices":[{"index":0,"delta":'
        self._suffix = "}]" + (',"usage":null' if chat.include_usage else "") + "}\n\n"
        self._head = head

    def delta(self, delta: dict[str, str], finish_reason: str | None = None) -> str:
        reason = json.dumps(finish_reason)
        return (
            f'{self._prefix}{json.dumps(delta)},"logprobs":null,'
            f'"finish_reason":{reason}{self._suffix}'
        )

    def content(self, text: str) -> str:
        return (
            f'{self._prefix}{{"content":{json.dumps(text)}}},"logprobs":null,'
            f'"finish_reason":null{self._suffix}'
        )

    def usage(self, usage: Usage) -> str:
        chunk = {**self._head, "choices": [], "usage": usage.model_dump()}
        return f"data: {json.dumps(chunk)}\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


class ChatService:
    def __init__(
        self,
        backend: Backend,
        catalog: ModelCatalog,
        default_template: str,
        sessions: SessionStore | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.backend = backend
        self.catalog = catalog
        self.default_template = default_template
        self.sessions = sessions
        self.metrics = metrics

    async def prepare(
        self,
        request: ChatCompletionRequest,
        session_id: str | None = None,
        owner: str = "",
    ) -> PreparedChat:
        """Validates the request and renders its prompt. With ``session_id`` the stored
        conversation of ``owner`` (a key id) comes first."""
        problem = request.unsupported()
        if problem is not None:
            param, message = problem
            raise InvalidRequestError(message, param=param, code="unsupported_parameter")
        model = await self.catalog.get(request.model, "chat")
        options = sampling_options(request)
        if model.context_length and (options.max_tokens or 0) >= model.context_length:
            # Caught here because an error the model reports mid-stream carries no kind.
            raise InvalidRequestError(
                f"max_tokens is {options.max_tokens}, but the model's context length is "
                f"{model.context_length} tokens (prompt included).",
                param="max_completion_tokens" if request.max_completion_tokens else "max_tokens",
                code="context_length_exceeded",
            )
        messages = _template_messages(request.messages)
        session = None
        if session_id is not None:
            if self.sessions is None:
                raise InvalidRequestError("Sessions are not enabled.", param="X-Session-ID")
            stored = await self.sessions.open(session_id, owner)
            session = plan(stored, messages, model.context_length, options.max_tokens)
            messages = session.messages
        prompt = render_chat(model.chat_template or self.default_template, messages)
        return PreparedChat(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=request.model,
            prompt=prompt,
            options=options,
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            session=session,
        )

    async def _remember(self, chat: PreparedChat, reply: str, completion_tokens: int) -> None:
        if chat.session is not None and self.sessions is not None:
            await self.sessions.save_turn(chat.session, reply, completion_tokens)

    async def complete(self, chat: PreparedChat, meter: Meter | None = None) -> ChatCompletion:
        texts: list[str] = []
        finish, prompt_tokens, completion_tokens = None, 0, 0
        chunks = self.backend.generate(chat.model, chat.prompt, chat.options, stream=False)
        async with aclosing(chunks):
            async for chunk in chunks:
                texts.append(chunk.text)
                finish = chunk.finish_reason or finish
                prompt_tokens = chunk.prompt_tokens or prompt_tokens
                completion_tokens += chunk.completion_tokens
        if meter is not None:
            meter.add_tokens(prompt_tokens, completion_tokens)
        reply = "".join(texts)
        await self._remember(chat, reply, completion_tokens)
        return ChatCompletion(
            id=chat.id,
            created=chat.created,
            model=chat.model,
            choices=[
                ChatCompletionChoice(
                    message=ChatCompletionMessage(content=reply),
                    finish_reason=finish or "stop",
                )
            ],
            usage=_usage(prompt_tokens, completion_tokens),
        )

    async def stream(self, chat: PreparedChat, meter: Meter | None = None) -> AsyncIterator[str]:
        """Starts generating and returns the SSE body. Raises (for a real HTTP error status)
        if the backend fails before its first chunk."""
        chunks = self.backend.generate(chat.model, chat.prompt, chat.options, stream=True)
        first = await first_or_close(chunks)
        return self._sse(self._events(chat, chunks, first, meter or Meter()))

    async def _events(
        self,
        chat: PreparedChat,
        chunks: AsyncGenerator[GenerationChunk, None],
        first: GenerationChunk | None,
        meter: Meter,
    ) -> AsyncGenerator[str, None]:
        writer = _ChunkWriter(chat)
        timer = ChatTimer(self.metrics, chat.model, chat.started)
        finish, prompt_tokens, completion_tokens = None, 0, 0
        texts: list[str] = []
        async with aclosing(chunks):
            yield writer.delta({"role": "assistant", "content": ""})
            chunk = first
            while chunk is not None:
                # Counted before the text is sent: what was generated counts even for a
                # client that leaves mid-stream (the generator may never be resumed).
                if chunk.prompt_tokens and not prompt_tokens:
                    prompt_tokens = chunk.prompt_tokens
                    meter.add_tokens(prompt_tokens, 0)
                completion_tokens += chunk.completion_tokens
                meter.add_tokens(0, chunk.completion_tokens)
                finish = chunk.finish_reason or finish
                if chunk.text:
                    timer.piece()
                    texts.append(chunk.text)
                    yield writer.content(chunk.text)
                chunk = await anext(chunks, None)
        await self._remember(chat, "".join(texts), completion_tokens)
        yield writer.delta({}, finish or "stop")
        if chat.include_usage:
            yield writer.usage(_usage(prompt_tokens, completion_tokens))

    async def _sse(self, events: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
        async with aclosing(with_error_event(events, "chat")) as guarded:
            async for item in guarded:
                yield item
        yield "data: [DONE]\n\n"  # always, after an error event too
