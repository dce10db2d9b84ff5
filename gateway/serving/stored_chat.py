"""Stored chat completions: a chat request with ``store: true`` is generated as any other
(:class:`~gateway.serving.chat.ChatService`) and then kept, with its request's messages
and ``metadata``, in the key's :class:`~gateway.state.chat_completions.ChatCompletionStore`.

The room its record takes as known before generating (its messages and metadata) is held
first: a record that could never fit (400 ``stored_record_too_large``), a key at its quota
or at its count of stored completions (403 ``storage_quota_exceeded``) is refused before
any token is generated. The hold becomes the record once the answer is there, and is given
back when it is not stored (a failure, a client that left, a stream cut short).

A streamed completion is stored as the client received it: its chunks are read as they
pass (every choice's content, reasoning, tool calls, log probabilities and finish reason)
and stored when the stream ends, before ``[DONE]`` is sent, so a client that reads
``[DONE]`` finds it stored. Its usage is always collected (the stream runs with
``include_usage``; a client that did not ask for it gets the chunks it would have got
without it). An answer that makes the record too large ends the stream with an ``error``
event instead, and nothing is stored.

Audio (``input_audio`` parts, spoken answers) is not stored: such a request with
``store: true`` is a 400 naming ``store``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, cast

from pydantic import Field

from gateway.errors import InvalidRequestError
from gateway.serving.chat import ChatService, PreparedChat
from gateway.serving.protocol import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceLogprobs,
    FunctionCall,
    Strict,
    TokenLogprobItem,
    ToolCall,
    Usage,
)
from gateway.serving.protocol.common import list_page
from gateway.serving.sse import event, failure
from gateway.state.chat_completions import ChatCompletionStore, StoredChatCompletion
from gateway.state.limits import Meter
from gateway.state.stored_bytes import Hold

#: What a chunk written with ``include_usage`` carries that one written without it lacks.
_USAGE_NULL = ',"usage":null}\n\n'
_DONE = "data: [DONE]\n\n"
#: The parts of a message's content the messages list shows (OpenAI's ``content_parts``).
_SHOWN_PARTS = ("text", "image_url")
#: OpenAI's ``metadata``: 16 pairs, keys of 64 characters, values of 512.
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]


def store_messages(completion_id: str, messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The request's messages as the messages list returns them: each with its id
    (``<completion id>-<index>``); a message sent as content parts has them as
    ``content_parts`` (text and image parts) and their text, joined, as ``content``."""
    stored = []
    for index, message in enumerate(messages):
        data = message.model_dump(exclude_none=True)
        content = message.content
        if isinstance(content, list):
            parts = [p.model_dump(exclude_none=True) for p in content if p.type in _SHOWN_PARTS]
            texts = [p.text for p in content if p.type == "text" and p.text is not None]
            data["content"] = "\n".join(texts) if texts else None
            data["content_parts"] = parts
        else:
            data["content"] = content
            data["content_parts"] = None
        stored.append({"id": f"{completion_id}-{index}", **data})
    return stored


@dataclass
class _Choice:
    """One choice of a stream, as its chunks built it."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    function: dict[str, str] | None = None
    logprobs: list[dict[str, Any]] | None = None
    finish_reason: str | None = None

    def add(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        self.content.append(delta.get("content") or "")
        self.reasoning.append(delta.get("reasoning_content") or "")
        for piece in delta.get("tool_calls") or []:
            call = self.calls.setdefault(piece["index"], {"name": "", "arguments": ""})
            call["id"] = piece.get("id") or call.get("id")
            function = piece.get("function") or {}
            call["name"] += function.get("name") or ""
            call["arguments"] += function.get("arguments") or ""
        if "function_call" in delta:
            legacy = self.function or {"name": "", "arguments": ""}
            legacy["name"] += delta["function_call"].get("name") or ""
            legacy["arguments"] += delta["function_call"].get("arguments") or ""
            self.function = legacy
        logprobs = choice.get("logprobs")
        if logprobs is not None:
            self.logprobs = [*(self.logprobs or []), *(logprobs.get("content") or [])]
        self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def choice(self, index: int) -> ChatCompletionChoice:
        calls = [
            ToolCall(
                id=call["id"],
                function=FunctionCall(name=call["name"], arguments=call["arguments"]),
            )
            for _, call in sorted(self.calls.items())
        ]
        content = "".join(self.content)
        reasoning = "".join(self.reasoning) or None
        function = FunctionCall(**self.function) if self.function is not None else None
        logprobs = None
        if self.logprobs is not None:
            items = [TokenLogprobItem.model_validate(item) for item in self.logprobs]
            logprobs = ChoiceLogprobs(content=items)
        return ChatCompletionChoice(
            index=index,
            message=ChatCompletionMessage(
                content=None if not content and (calls or function) else content,
                tool_calls=calls or None,
                function_call=function,
                reasoning_content=reasoning,
                reasoning=reasoning,
            ),
            finish_reason=self.finish_reason or "stop",
            logprobs=logprobs,
        )


@dataclass
class _Assembled:
    """A streamed completion built from its chunks."""

    chat: PreparedChat
    choices: list[_Choice]
    usage: Usage | None = None
    failed: bool = False

    def read(self, payload: dict[str, Any]) -> None:
        if "error" in payload:
            self.failed = True
            return
        if payload.get("usage") is not None:
            self.usage = Usage.model_validate(payload["usage"])
        for choice in payload.get("choices") or []:
            self.choices[choice["index"]].add(choice)

    def completion(self) -> ChatCompletion:
        chat = self.chat
        return ChatCompletion(
            id=chat.id,
            created=chat.created,
            model=chat.model,
            choices=[choice.choice(i) for i, choice in enumerate(self.choices)],
            usage=self.usage or Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0),
        )


class StoredChat:
    """Chat completions with ``store: true``: generated by ``chat``, kept in ``store``."""

    def __init__(self, chat: ChatService, store: ChatCompletionStore) -> None:
        self.chat = chat
        self.store = store

    @staticmethod
    def check(request: ChatCompletionRequest, audio: bool) -> None:
        """Refuses what cannot be stored, before any audio is transcribed."""
        if request.store and audio:
            raise InvalidRequestError(
                "Stored chat completions hold text: a request with audio (input_audio "
                "parts, an earlier spoken answer, or audio output) cannot be stored. "
                "Send store: false.",
                param="store",
                code="unsupported_parameter",
            )

    def _record(
        self, owner: str, request: ChatCompletionRequest, completion: dict[str, Any]
    ) -> StoredChatCompletion:
        completion = {**completion, "metadata": dict(request.metadata or {})}
        messages = store_messages(str(completion["id"]), request.messages)
        return StoredChatCompletion(owner=owner, completion=completion, messages=messages)

    async def _hold(self, chat: PreparedChat, request: ChatCompletionRequest, owner: str) -> Hold:
        """Holds the room of the record as known before generating (all but the answer)."""
        known = {"id": chat.id, "object": "chat.completion", "created": chat.created}
        known |= {"model": chat.model, "choices": []}
        return await self.store.hold(self._record(owner, request, known))

    async def complete(
        self,
        chat: PreparedChat,
        request: ChatCompletionRequest,
        owner: str,
        meter: Meter | None = None,
    ) -> ChatCompletion:
        """The completion, stored before it is returned (nothing is when it fails)."""
        hold: Hold | None = await self._hold(chat, request, owner)
        try:
            completion = await self.chat.complete(chat, meter)
            record = self._record(owner, request, completion.model_dump(mode="json"))
            await self.store.save(record, hold)
            hold = None  # it is the record's now
            return completion
        finally:
            await self.store.release(hold)

    async def stream(
        self,
        chat: PreparedChat,
        request: ChatCompletionRequest,
        owner: str,
        meter: Meter | None = None,
    ) -> AsyncIterator[str]:
        """Starts generating and returns the SSE body, which stores the completion when it
        ends. Raises (for a real HTTP error status) before the first chunk, as
        :meth:`ChatService.stream` does, holding nothing then."""
        hold = await self._hold(chat, request, owner)
        try:
            events = await self.chat.stream(replace(chat, include_usage=True), meter)
        except BaseException:
            await self.store.release(hold)
            raise
        assembled = _Assembled(chat, [_Choice() for _ in range(chat.n)])
        return self._storing(events, assembled, request, owner, hold)

    async def _storing(
        self,
        events: AsyncIterator[str],
        assembled: _Assembled,
        request: ChatCompletionRequest,
        owner: str,
        hold: Hold | None,
    ) -> AsyncGenerator[str, None]:
        wants_usage = assembled.chat.include_usage
        try:
            async with aclosing(cast(AsyncGenerator[str, None], events)):
                async for chunk in events:
                    if chunk == _DONE:
                        if not assembled.failed:
                            try:
                                completion = assembled.completion().model_dump(mode="json")
                                record = self._record(owner, request, completion)
                                await self.store.save(record, hold)
                                hold = None  # it is the record's now
                            except Exception as exc:
                                yield event(failure(exc, "stored chat"))
                        yield chunk
                        continue
                    payload = json.loads(chunk.removeprefix("data: "))
                    assembled.read(payload)
                    if not wants_usage:
                        if payload.get("usage") is not None:
                            continue  # the usage chunk the client did not ask for
                        if chunk.endswith(_USAGE_NULL):
                            chunk = chunk[: -len(_USAGE_NULL)] + "}\n\n"
                    yield chunk
        finally:
            await self.store.release(hold)

    async def list(
        self,
        owner: str,
        model: str | None,
        metadata: dict[str, str],
        after: str | None,
        limit: int,
        order: str,
    ) -> dict[str, Any]:
        """A page of the caller's stored completions, as OpenAI lists them."""
        found = await self.store.list(
            owner, model=model, metadata=metadata, after=after, limit=limit, order=order
        )
        return list_page([record.completion for record in found.records], found.has_more)

    async def retrieve(self, owner: str, completion_id: str) -> dict[str, Any]:
        return (await self.store.get(owner, completion_id)).completion

    async def update(
        self, owner: str, completion_id: str, metadata: dict[str, str] | None
    ) -> dict[str, Any]:
        return (await self.store.update(owner, completion_id, metadata)).completion

    async def delete(self, owner: str, completion_id: str) -> dict[str, Any]:
        await self.store.delete(owner, completion_id)
        return {"id": completion_id, "object": "chat.completion.deleted", "deleted": True}

    async def messages(
        self, owner: str, completion_id: str, after: str | None, limit: int, order: str
    ) -> dict[str, Any]:
        """A page of the stored completion's request messages (``after``: a message id)."""
        messages = (await self.store.get(owner, completion_id)).messages
        if order == "desc":
            messages = messages[::-1]
        if after is not None:
            ids = [message["id"] for message in messages]
            if after not in ids:
                raise InvalidRequestError(
                    f"No message with id '{after}' in chat completion '{completion_id}'.",
                    param="after",
                )
            messages = messages[ids.index(after) + 1 :]
        return list_page(messages[:limit], len(messages) > limit)


class StoredChatUpdate(Strict):
    """``POST /v1/chat/completions/{id}``: the metadata that replaces the stored one."""

    metadata: Metadata | None
