"""A streamed chat completion's SSE events: each choice's deltas (content, reasoning,
tool calls as the parser reads them, a strict call's arguments once checked), its
``finish_reason``, and the usage chunk; what it said is remembered for a session."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from gateway.metrics import ChatTimer, Metrics
from gateway.serving import generation
from gateway.serving.chat.answers import (
    ChoiceState,
    call_delta,
    finish_reason,
    in_text,
    tool_calls_of,
)
from gateway.serving.chat.prepared import PreparedChat
from gateway.serving.protocol import ChoiceLogprobs
from gateway.serving.sampling import logprob_items
from gateway.serving.sse import ChunkWriter
from gateway.serving.tool_parsers import ParsedCall, ParserDelta, ToolCallDelta

#: Checks a strict call's arguments and makes them again when they do not match
#: (:meth:`~gateway.serving.chat.service.ChatService.strict_arguments`).
StrictArguments = Callable[
    [PreparedChat, generation.GenerationRun, int, ParsedCall, str, int], Awaitable[str]
]
#: Keeps a session's answer (:meth:`~gateway.serving.chat.service.ChatService.remember`).
Remember = Callable[[PreparedChat, dict[str, Any], int], Awaitable[None]]


class ChatStream:
    """The events of one streamed completion, given what it calls of the service."""

    def __init__(
        self, metrics: Metrics | None, strict_arguments: StrictArguments, remember: Remember
    ) -> None:
        self.metrics = metrics
        self.strict_arguments = strict_arguments
        self.remember = remember

    def _logprobs_json(self, chat: PreparedChat, state: ChoiceState) -> str:
        if chat.logprobs is None or not state.logprobs:
            return "null"
        items = logprob_items(state.logprobs, chat.logprobs)
        state.logprobs = []
        return ChoiceLogprobs(content=items).model_dump_json()

    async def events(
        self,
        chat: PreparedChat,
        pieces: AsyncGenerator[generation.ChoiceChunk, None],
        run: generation.GenerationRun,
    ) -> AsyncGenerator[str, None]:
        writer = ChunkWriter.chat(chat.id, chat.created, chat.model, chat.include_usage)
        timer = ChatTimer(self.metrics, chat.model, chat.started)
        states = [
            ChoiceState(
                chat.tools.new_parser() if chat.tools is not None else None, chat.reasoning()
            )
            for _ in range(chat.n)
        ]
        async with aclosing(pieces):
            for index in range(chat.n):
                yield writer.delta(index, {"role": "assistant", "content": ""})
            async for index, chunk in pieces:
                state = states[index]
                if chunk is None:
                    if not state.ended:
                        for event in await self._close_choice(chat, writer, run, index, state):
                            yield event
                    continue
                # Counted before the text is sent: what was generated counts even for a
                # client that leaves mid-stream (the generator may never be resumed).
                run.add(index, chunk)
                state.completion_tokens += chunk.completion_tokens
                state.finish = chunk.finish_reason or state.finish
                state.logprobs.extend(chunk.logprobs)
                if state.reasoner is not None and not chunk.text:
                    state.reasoning_tokens.add(state.reasoner, "", chunk.completion_tokens)
                if not chunk.text or state.ended:
                    continue
                timer.piece()
                text = chunk.text
                if state.parser is not None:
                    state.text.append(text)
                if state.reasoner is not None:
                    told = state.reasoning_tokens.add(state.reasoner, text, chunk.completion_tokens)
                    if told.reasoning:
                        yield self._reasoning(chat, writer, index, state, told.reasoning)
                    text = told.content
                    if not text:
                        continue
                for event in self._answer(chat, writer, index, state, text):
                    yield event
                if state.parser is not None and state.parser.closed:
                    for event in await self._close_choice(chat, writer, run, index, state):
                        yield event
                    if all(s.ended for s in states):
                        break  # leaving closes the generations still running
        first = states[0]
        content = "".join(first.content)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if chat.tools is not None and not content:
            message["content"] = None
        if first.calls:
            message["tool_calls"] = [call.model_dump() for call in tool_calls_of(first.calls)]
        await self.remember(chat, message, first.completion_tokens)
        if chat.reasoner is not None:
            run.reasoning_tokens = sum(s.reasoning_tokens.count for s in states)
        if chat.include_usage:
            yield writer.usage(run.usage())

    def _answer(
        self, chat: PreparedChat, writer: ChunkWriter, index: int, state: ChoiceState, text: str
    ) -> list[str]:
        """Events for a piece of the answer: content, or what the tool parser reads in it."""
        if state.parser is None:
            state.content.append(text)
            return [writer.content(index, text, self._logprobs_json(chat, state))]
        return self._parsed(chat, writer, index, state, state.parser.feed(text))

    def _reasoning(
        self, chat: PreparedChat, writer: ChunkWriter, index: int, state: ChoiceState, text: str
    ) -> str:
        delta = {"reasoning_content": text, "reasoning": text}
        return writer.delta(index, delta, None, self._logprobs_json(chat, state))

    def _parsed(
        self,
        chat: PreparedChat,
        writer: ChunkWriter,
        index: int,
        state: ChoiceState,
        delta: ParserDelta,
    ) -> list[str]:
        events = []
        if delta.content:
            state.content.append(delta.content)
            events.append(writer.content(index, delta.content, self._logprobs_json(chat, state)))
        assert chat.tools is not None
        sent = []
        for piece in delta.calls:
            if piece.id is not None:
                at = in_text(piece.at, state.reasoner)
                state.calls.append(ParsedCall(piece.id, piece.name or "", "", at))
            call = state.calls[piece.index]
            call.arguments += piece.arguments
            if call.name in chat.tools.strict:
                piece = replace(piece, arguments="")  # sent once checked (_close_choice)
            if piece.id is not None or piece.arguments:
                sent.append(piece)
        if sent:
            events.append(
                writer.delta(
                    index,
                    call_delta(sent, chat.tools.legacy),
                    None,
                    self._logprobs_json(chat, state),
                )
            )
        return events

    async def _close_choice(
        self,
        chat: PreparedChat,
        writer: ChunkWriter,
        run: generation.GenerationRun,
        index: int,
        state: ChoiceState,
    ) -> list[str]:
        state.ended = True
        events = []
        finish = state.finish or "stop"
        if state.reasoner is not None:
            told = state.reasoner.finish()
            if told.reasoning:
                events.append(self._reasoning(chat, writer, index, state, told.reasoning))
            if told.content:
                events += self._answer(chat, writer, index, state, told.content)
        if state.parser is not None:
            assert chat.tools is not None
            events += self._parsed(chat, writer, index, state, state.parser.finish())
            if state.parser.closed:
                finish = "stop"  # the answer ends with its call; the rest was dropped
            text = "".join(state.text)
            for number, call in enumerate(state.calls):
                if call.name not in chat.tools.strict:
                    continue
                call.arguments = await self.strict_arguments(
                    chat, run, index, call, text, state.completion_tokens
                )
                piece = ToolCallDelta(number, arguments=call.arguments)
                events.append(writer.delta(index, call_delta([piece], chat.tools.legacy)))
        finish = finish_reason(finish, len(state.calls), chat.tools)
        events.append(writer.delta(index, {}, finish, self._logprobs_json(chat, state)))
        return events
