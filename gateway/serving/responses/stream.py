"""The streamed Responses event sequence: :class:`StreamWriter` turns the backend's
pieces into numbered events, one output item at a time (a reasoning model's reasoning
first, as a ``reasoning`` item with ``response.reasoning_text.delta`` events), checking a
strict tool's arguments before they are sent, and finishes (and stores) the response
through the callables it is given (:data:`Finish`; a background run's claims its end
first)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from gateway.backend import TokenLogprob
from gateway.serving import generation
from gateway.serving.chat.stream import StrictArguments
from gateway.serving.protocol import Usage
from gateway.serving.reasoning_parsers import ReasoningTokens
from gateway.serving.responses.conversion import output_logprobs, response_object
from gateway.serving.responses.items import (
    FunctionCallItem,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    Status,
    dump,
)
from gateway.serving.responses.protocol import PreparedResponse
from gateway.serving.tool_parsers import ParsedCall, ParserDelta
from gateway.state.responses import new_id

#: Makes the final response object from its status, output and usage, and stores it
#: (:meth:`~gateway.serving.responses.service.ResponsesService.finish`).
Finish = Callable[[PreparedResponse, str, list[OutputItem], Usage], Awaitable[dict[str, Any]]]


class StreamWriter:
    """Turns the backend's pieces into Responses events, one output item at a time."""

    def __init__(
        self, prepared: PreparedResponse, strict_arguments: StrictArguments, finish: Finish
    ) -> None:
        self.prepared = prepared
        self.strict_arguments = strict_arguments
        self.finish = finish
        self.sequence = 0
        self.output: list[OutputItem] = []
        self.open: OutputItem | None = None
        """The item being written: reasoning or a message (in its ``in_progress`` form,
        its text so far in :attr:`open_text`), or a function call (its arguments so far)."""
        self.open_text = ""
        self.pending: list[TokenLogprob] = []
        """Log probabilities of tokens not yet sent with a text delta."""
        self.logprobs: list[dict[str, Any]] = []
        """Those sent with the open message's deltas."""
        self.text = ""
        """Everything generated so far (a strict call's arguments continue it)."""
        self.call_name = ""
        """The open call's function as the model named it (a namespace's: joined)."""
        self.call_at: int | None = None
        """Where the open call's arguments start in :attr:`text`."""
        self.generation_run: generation.GenerationRun | None = None
        self.reasoner = prepared.chat.reasoning()
        self.reasoning_tokens = ReasoningTokens()

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def _index(self) -> int:
        return len(self.output)

    def _strict(self) -> bool:
        """Whether the open item is a call of a strict tool: its arguments are sent once
        checked against the schema (see :meth:`ChatService.strict_arguments`)."""
        tools = self.prepared.chat.tools
        open_ = self.open
        return (
            isinstance(open_, FunctionCallItem)
            and tools is not None
            and (self.call_name in tools.strict)
        )

    async def _part(
        self, item: MessageItem | ReasoningItem, part: OutputText | ReasoningText
    ) -> list[str]:
        """Events that close the open item and open ``item``, with its one content ``part``."""
        events = await self._close("completed")
        self.open, self.open_text = item, ""
        index = self._index()
        events.append(self.event("response.output_item.added", output_index=index, item=dump(item)))
        ids = {"item_id": item.id, "output_index": index, "content_index": 0}
        events.append(self.event("response.content_part.added", **ids, part=part.model_dump()))
        return events

    def _part_delta(self, kind: str, text: str, **fields: Any) -> str:
        """The open item's text grows by ``text``: its ``kind`` of delta event."""
        assert self.open is not None
        self.open_text += text
        ids = {"item_id": self.open.id, "output_index": self._index(), "content_index": 0}
        return self.event(kind, **ids, delta=text, **fields)

    async def _text(self, text: str) -> list[str]:
        events = []
        if not isinstance(self.open, MessageItem):
            opened = MessageItem.opened(new_id("msg"))
            events = await self._part(opened, OutputText(text=""))
            self.logprobs = []
        if not text:
            return events
        logprobs = self._take_logprobs()
        self.logprobs += logprobs
        return [*events, self._part_delta("response.output_text.delta", text, logprobs=logprobs)]

    async def _reasoning(self, text: str) -> list[str]:
        events = []
        if not isinstance(self.open, ReasoningItem):
            opened = ReasoningItem.opened(new_id("rs"))
            events = await self._part(opened, ReasoningText(text=""))
        self.pending = []  # a reasoning_text part carries no log probabilities
        return [*events, self._part_delta("response.reasoning_text.delta", text)]

    def _take_logprobs(self) -> list[dict[str, Any]]:
        logprobs = output_logprobs(self.prepared.chat, self.pending)
        self.pending = []
        return logprobs

    async def _calls(self, delta: ParserDelta) -> list[str]:
        events = []
        for piece in delta.calls:
            limit = self.prepared.request.max_tool_calls
            if limit is not None and piece.index >= limit:
                continue
            if piece.id is not None:
                events += await self._close("completed")
                self.call_name = piece.name or ""
                self.open = FunctionCallItem.called(
                    new_id("fc"),
                    piece.id,
                    self.call_name,
                    "",
                    "in_progress",
                    self.prepared.tool_names,
                )
                self.call_at = piece.at
                if piece.at is not None and self.reasoner is not None:
                    self.call_at = piece.at + (self.reasoner.content_at or 0)
                events.append(
                    self.event(
                        "response.output_item.added",
                        output_index=self._index(),
                        item=dump(self.open),
                    )
                )
            if piece.arguments and isinstance(self.open, FunctionCallItem):
                self.open.arguments += piece.arguments
                if self._strict():
                    continue
                events.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=self.open.id,
                        output_index=self._index(),
                        delta=piece.arguments,
                    )
                )
        return events

    async def _close(self, status: Status) -> list[str]:
        """Ends the open item with its ``.done`` events and adds it to the output."""
        strict = self._strict()
        item, self.open = self.open, None
        if item is None:
            return []
        index = self._index()
        events = []
        if isinstance(item, FunctionCallItem) and strict:
            assert self.generation_run is not None
            call = ParsedCall(item.call_id, self.call_name, item.arguments, self.call_at)
            item.arguments = await self.strict_arguments(
                self.prepared.chat,
                self.generation_run,
                0,
                call,
                self.text,
                self.generation_run.completion_tokens,
            )
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item.id,
                    output_index=index,
                    delta=item.arguments,
                )
            )
        text = self.open_text
        if isinstance(item, ReasoningItem):
            item = ReasoningItem.done(item.id, text, self.prepared.sealed(text))
            ids = {"item_id": item.id, "output_index": index, "content_index": 0}
            events.append(self.event("response.reasoning_text.done", **ids, text=text))
            part = item.content[0].model_dump()
            events.append(self.event("response.content_part.done", **ids, part=part))
        elif isinstance(item, MessageItem):
            logprobs = self.logprobs + self._take_logprobs()
            item = MessageItem.done(item.id, text, status, logprobs)
            ids = {"item_id": item.id, "output_index": index, "content_index": 0}
            events.append(
                self.event("response.output_text.done", **ids, text=text, logprobs=logprobs)
            )
            part = item.content[0].model_dump()
            events.append(self.event("response.content_part.done", **ids, part=part))
        else:
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item.id,
                    output_index=index,
                    name=item.name,
                    arguments=item.arguments,
                )
            )
            item.status = "completed"
        events.append(self.event("response.output_item.done", output_index=index, item=dump(item)))
        self.output.append(item)
        return events

    async def _feed(self, text: str, tokens: int, parser: Any) -> list[str]:
        """Events for a piece of generated text (``tokens`` long)."""
        self.text += text
        events = []
        if self.reasoner is not None:
            told = self.reasoning_tokens.add(self.reasoner, text, tokens)
            if told.reasoning:
                events += await self._reasoning(told.reasoning)
            text = told.content
            if not text:
                return events
        return events + await self._answer(text, parser)

    async def _answer(self, text: str, parser: Any) -> list[str]:
        """Events for a piece of the answer: text, or what the tool parser reads in it."""
        delta = parser.feed(text) if parser is not None else ParserDelta(content=text)
        return await self._delta(delta)

    async def _delta(self, delta: ParserDelta) -> list[str]:
        events = await self._text(delta.content) if delta.content else []
        return events + await self._calls(delta)

    async def events(
        self, pieces: AsyncGenerator[generation.ChoiceChunk, None], run: generation.GenerationRun
    ) -> AsyncGenerator[str, None]:
        prepared = self.prepared
        chat = prepared.chat
        self.generation_run = run
        parser = chat.tools.new_parser() if chat.tools is not None else None
        snapshot = response_object(prepared, "in_progress", [])
        finish = "stop"
        # Held from the first event: the generations run already, and closing these events
        # before the first chunk is read (a cancel while the first events are logged) must
        # stop them too, not leave them to the garbage collector.
        async with aclosing(pieces):
            yield self.event("response.created", response=snapshot)
            yield self.event("response.in_progress", response=snapshot)
            async for index, chunk in pieces:
                if chunk is None:
                    continue
                # Counted before the text is sent (a client may leave mid-stream).
                run.add(index, chunk)
                finish = chunk.finish_reason or finish
                self.pending += chunk.logprobs
                if chunk.text or (self.reasoner is not None and chunk.completion_tokens):
                    for item in await self._feed(chunk.text, chunk.completion_tokens, parser):
                        yield item
        if self.reasoner is not None:
            told = self.reasoner.finish()
            if told.reasoning:
                for item in await self._reasoning(told.reasoning):
                    yield item
            if told.content:
                for item in await self._answer(told.content, parser):
                    yield item
            run.reasoning_tokens = self.reasoning_tokens.count
        if parser is not None:
            for item in await self._delta(parser.finish()):
                yield item
        status: Status = "incomplete" if finish == "length" else "completed"
        items = [*self.output, self.open]
        if not any(isinstance(item, MessageItem | FunctionCallItem) for item in items):
            # an answer, if empty
            for item in await self._text(""):
                yield item
        for item in await self._close(status):
            yield item
        final = await self.finish(prepared, status, self.output, run.usage())
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        yield self.event(kind, response=final)
