"""A streamed message's events, as Anthropic sends them: ``message_start`` (with the input
tokens, once the model has counted them), ``ping``, then per content block
``content_block_start``, its deltas (``thinking_delta`` and a ``signature_delta`` at its
end, ``text_delta``, ``input_json_delta``) and ``content_block_stop``, and finally
``message_delta`` (the ``stop_reason`` and the usage) and ``message_stop``. A failure after
the stream began ends it with an ``error`` event (the HTTP status is already sent)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from gateway.serving import generation
from gateway.serving.chat import PreparedChat
from gateway.serving.chat.stream import StrictArguments
from gateway.serving.messages.conversion import message, stop_reason, usage
from gateway.serving.reasoning_parsers import ReasoningTokens
from gateway.serving.tool_parsers import ParsedCall, ParserDelta


def event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


class MessageStream:
    """Turns the backend's pieces into Messages events, one content block at a time."""

    def __init__(
        self,
        chat: PreparedChat,
        message_id: str,
        model: str,
        thinking: bool,
        strict_arguments: StrictArguments,
        sign: Callable[[str], str],
        omitted: bool = False,
    ) -> None:
        self.chat = chat
        self.strict_arguments = strict_arguments
        self.sign = sign
        """Seals a thinking block's reasoning as its ``signature`` (``signature_delta``)."""
        self.omitted = omitted
        """Thinking blocks carry their signature only (``display: "omitted"``)."""
        self.reasoning = ""
        """The open thinking block's reasoning so far."""
        self.message_id = message_id
        self.model = model
        self.thinking = thinking
        """Whether the model's reasoning is shown (``thinking`` blocks); else it is dropped."""
        self.index = -1
        self.open: str | None = None
        """The open block's type: ``text``, ``thinking`` or ``tool_use``."""
        self.calls = 0
        self.call: ParsedCall | None = None
        """The open ``tool_use`` block's call (its arguments so far)."""
        self.text = ""
        """Everything generated so far (a strict call's arguments continue it)."""
        self.run: generation.GenerationRun | None = None
        self.reasoner = chat.reasoning()
        self.reasoning_tokens = ReasoningTokens()

    async def _start(self, block: dict[str, Any]) -> list[str]:
        events = await self._stop()
        self.index += 1
        self.open = block["type"]
        events.append(event("content_block_start", index=self.index, content_block=block))
        return events

    async def _stop(self) -> list[str]:
        """Ends the open block; a strict tool's call sends its arguments now, checked
        against its schema (made again when they do not match)."""
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            signature = {"type": "signature_delta", "signature": self.sign(self.reasoning)}
            events.append(self._delta(signature))
        call, self.call = self.call, None
        if call is not None and self._strict(call):
            assert self.run is not None
            used = self.run.completion_tokens
            checked = await self.strict_arguments(self.chat, self.run, 0, call, self.text, used)
            events.append(self._delta({"type": "input_json_delta", "partial_json": checked}))
        self.open = None
        return [*events, event("content_block_stop", index=self.index)]

    def _strict(self, call: ParsedCall) -> bool:
        tools = self.chat.tools
        return tools is not None and call.name in tools.strict

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", index=self.index, delta=delta)

    async def _text(self, text: str) -> list[str]:
        events = [] if self.open == "text" else await self._start({"type": "text", "text": ""})
        return [*events, self._delta({"type": "text_delta", "text": text})]

    async def _reasoning(self, text: str) -> list[str]:
        if not self.thinking:
            return []
        events = []
        if self.open != "thinking":
            events = await self._start({"type": "thinking", "thinking": "", "signature": ""})
            self.reasoning = ""
        self.reasoning += text
        if self.omitted:
            return events
        return [*events, self._delta({"type": "thinking_delta", "thinking": text})]

    async def _parsed(self, delta: ParserDelta) -> list[str]:
        events = await self._text(delta.content) if delta.content else []
        for piece in delta.calls:
            if piece.id is not None:
                self.calls += 1
                name = piece.name or ""
                block = {"type": "tool_use", "id": piece.id, "name": name, "input": {}}
                events += await self._start(block)
                at = piece.at
                if at is not None and self.reasoner is not None:
                    at += self.reasoner.content_at or 0
                self.call = ParsedCall(piece.id, name, "", at)
            if piece.arguments and self.call is not None:
                self.call.arguments += piece.arguments
                if self._strict(self.call):
                    continue  # sent once checked (_stop)
                partial = {"type": "input_json_delta", "partial_json": piece.arguments}
                events.append(self._delta(partial))
        return events

    async def _answer(self, text: str, parser: Any) -> list[str]:
        delta = parser.feed(text) if parser is not None else ParserDelta(content=text)
        return await self._parsed(delta)

    async def _feed(self, text: str, tokens: int, parser: Any) -> list[str]:
        self.text += text
        if self.reasoner is None:
            return await self._answer(text, parser)
        told = self.reasoning_tokens.add(self.reasoner, text, tokens)
        events = await self._reasoning(told.reasoning) if told.reasoning else []
        return events + (await self._answer(told.content, parser) if told.content else [])

    def _message_start(self, run: generation.GenerationRun) -> list[str]:
        counted = {"input_tokens": run.prompt_tokens, "output_tokens": 0}
        started = message(self.message_id, self.model, [], None, counted)
        return [event("message_start", message=started), event("ping")]

    async def events(
        self, pieces: AsyncGenerator[generation.ChoiceChunk, None], run: generation.GenerationRun
    ) -> AsyncGenerator[str, None]:
        parser = self.chat.tools.new_parser() if self.chat.tools is not None else None
        self.run = run
        finish = "stop"
        matched: str | None = None
        started = False
        async with aclosing(pieces):
            async for index, chunk in pieces:
                if chunk is None:
                    continue
                run.add(index, chunk)  # counted before it is sent (a client may leave)
                if not started:  # the first chunk carries the prompt's token count
                    started = True
                    for item in self._message_start(run):
                        yield item
                finish = chunk.finish_reason or finish
                matched = chunk.stop_sequence or matched
                if chunk.text or (self.reasoner is not None and chunk.completion_tokens):
                    for item in await self._feed(chunk.text, chunk.completion_tokens, parser):
                        yield item
        if not started:
            for item in self._message_start(run):
                yield item
        tail: list[str] = []
        if self.reasoner is not None:
            told = self.reasoner.finish()
            tail += await self._reasoning(told.reasoning) if told.reasoning else []
            tail += await self._answer(told.content, parser) if told.content else []
            run.reasoning_tokens = self.reasoning_tokens.count
        if parser is not None:
            tail += await self._parsed(parser.finish())
        for item in [*tail, *await self._stop()]:
            yield item
        counted = usage(run.usage())
        stopped = stop_reason(finish, self.calls > 0, matched)
        delta = {
            "stop_reason": stopped,
            "stop_sequence": matched if stopped == "stop_sequence" else None,
        }
        yield event("message_delta", delta=delta, usage=counted)
        yield event("message_stop")
