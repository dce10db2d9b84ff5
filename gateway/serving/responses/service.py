"""The Responses service: :class:`ResponsesService` prepares a request (the stored chain,
the Responses checks, the chat validation naming Responses parameters, the store's size
bound, the room its record needs in the key's stored bytes), generates it whole or as a
stream of events, and stores the finished response.

A request with ``store`` holds the room its record takes as known before generating (all
but the answer): past the key's or its project's quota it is refused then (403
``storage_quota_exceeded``), before any token is generated. The hold becomes the record
when the response is stored, and is given back when it is not (a failure, a cancelled
request, a stream the client left)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import replace
from typing import Any

from cryptography.fernet import Fernet

from gateway import tracing
from gateway.errors import InvalidRequestError
from gateway.serving import generation
from gateway.serving.chat import ChatService, PreparedChat
from gateway.serving.protocol import Usage
from gateway.serving.responses import truncation
from gateway.serving.responses.conversion import (
    RESPONSES_NAMES,
    chat_request,
    image_names,
    input_messages,
    output_logprobs,
    response_object,
    stored_record,
)
from gateway.serving.responses.items import (
    FunctionCallItem,
    MessageItem,
    OutputItem,
    ReasoningItem,
    Status,
)
from gateway.serving.responses.protocol import PreparedResponse, ResponsesRequest
from gateway.serving.responses.references import References
from gateway.serving.responses.sealing import ReasoningSeal, opened
from gateway.serving.responses.stream import StreamWriter
from gateway.serving.responses.tools import chat_tools
from gateway.serving.sse import failure
from gateway.state.conversations import ConversationStore
from gateway.state.limits import Meter
from gateway.state.responses import ResponseStore, new_id


def _images(messages: list[dict[str, Any]]) -> int:
    return sum(
        1
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    )


class ResponsesService:
    def __init__(
        self,
        chat: ChatService,
        store: ResponseStore,
        seal: ReasoningSeal | None = None,
        references: References | None = None,
    ) -> None:
        self.chat = chat
        self.store = store
        # item_reference items and conversation= (over the same Redis as the store).
        self.references = references or References(
            store, ConversationStore(store.redis, store.ttl_s, store.max_stored_kb)
        )
        self.seal = seal or ReasoningSeal([Fernet.generate_key()])

    async def prepare(self, request: ResponsesRequest, owner: str) -> PreparedResponse:
        problem = request.unsupported()
        if problem is not None:
            raise InvalidRequestError(problem[1], param=problem[0], code="unsupported_parameter")
        history: list[dict[str, Any]] = []
        earlier: list[dict[str, Any]] = []
        response_id = new_id("resp")
        root = response_id
        if request.previous_response_id is not None:
            previous = await self.store.get(owner, request.previous_response_id)
            history = previous.messages
            earlier = [*previous.input_items, *previous.response["output"]]
            root = previous.root or request.previous_response_id
        continued = await self.references.conversation(request, owner)
        if continued is not None:
            history, earlier = continued.messages, continued.items
        request = await self.references.resolve(request, owner)
        tracing.annotate("gateway.client_metadata", request.client_metadata)
        given = opened(request.input, self.seal, owner)
        new, items = input_messages(given, history)
        messages = history + new
        tools, tool_names = chat_tools(request)
        chat, truncated = await self._chat(request, messages, tools, image_names(given, history))
        prepared = PreparedResponse(
            id=response_id,
            request=request,
            chat=chat,
            owner=owner,
            input_items=[*earlier, *items],
            messages=messages,
            root=root,
            tool_names=tool_names,
            truncated=truncated,
            conversation=continued.turn if continued is not None else None,
        )
        self.references.check_turn(continued, items)
        if request.wants_encrypted_reasoning() and chat.reasoner is not None:
            prepared.seal = self.seal.sealer(owner, request.model)
        if request.store is not False:
            # What is known before generating (all but the answer) must fit the store, and
            # the key's and project's quotas.
            known = stored_record(prepared, response_object(prepared, "in_progress", []), [])
            prepared.hold = await self.store.hold(known)
        return prepared

    async def _chat(
        self,
        request: ResponsesRequest,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        images: tuple[str, ...],
    ) -> tuple[PreparedChat, int]:
        """The chat request the response is served as, validated and rendered, and how many
        messages ``truncation: "auto"`` left out to fit the context."""
        names = replace(RESPONSES_NAMES, image_parts=images)

        async def prepare(kept: list[dict[str, Any]], trial: bool = False) -> PreparedChat:
            # An image's name is its place among the request's images: with messages left
            # out, the kept ones are the last.
            kept_names = replace(names, image_parts=images[len(images) - _images(kept) :])
            return await self.chat.prepare(
                chat_request(request, kept, tools), names=kept_names, read_images=not trial
            )

        if request.truncation != "auto":
            return await prepare(messages), 0
        chat, _, dropped = await truncation.fit(messages, prepare)
        return chat, dropped

    async def _give_back(self, prepared: PreparedResponse) -> None:
        """Gives back the room held for the request's record, if it still holds some."""
        hold, prepared.hold = prepared.hold, None
        await self.store.release(hold)

    @asynccontextmanager
    async def _held(self, prepared: PreparedResponse) -> AsyncIterator[None]:
        """Gives the request's hold back if it ends without storing its response."""
        try:
            yield
        finally:
            await self._give_back(prepared)

    async def finish(
        self,
        prepared: PreparedResponse,
        status: str,
        output: list[OutputItem],
        usage: Usage,
    ) -> dict[str, Any]:
        """The final response object; stored (with ``store``) before it is returned."""
        response = response_object(prepared, status, output, usage)
        await self.references.append_turn(prepared, output)  # conversation=, before storing
        if prepared.request.store is not False:
            await self.store.save(stored_record(prepared, response, output), prepared.hold)
            prepared.hold = None  # it is the record's now
        return response

    async def create(
        self, prepared: PreparedResponse, meter: Meter | None = None
    ) -> dict[str, Any]:
        async with self._held(prepared):
            chat = prepared.chat
            run = await self.chat.reserve_run(chat, meter)
            (result,) = await run.collect(pieces=chat.reasoner is not None)
            reply = await self.chat.answer(chat, run, 0, result, prepared.request.max_tool_calls)
            content, calls = reply.content, reply.calls
            status: Status = "incomplete" if result.finish_reason == "length" else "completed"
            output: list[OutputItem] = []
            if reply.reasoning is not None:
                sealed = prepared.sealed(reply.reasoning)
                output.append(ReasoningItem.done(new_id("rs"), reply.reasoning, sealed))
            if content or not calls:
                logprobs = output_logprobs(chat, result.logprobs)
                output.append(MessageItem.done(new_id("msg"), content or "", status, logprobs))
            for call in calls:
                item = FunctionCallItem.called(
                    new_id("fc"),
                    call.id,
                    call.name,
                    call.arguments,
                    "completed",
                    prepared.tool_names,
                )
                output.append(item)
            return await self.finish(prepared, status, output, run.usage())

    async def stream(
        self, prepared: PreparedResponse, meter: Meter | None = None
    ) -> AsyncIterator[str]:
        """Starts generating and returns the SSE body. Raises (for a real HTTP error status)
        if the backend fails before its first chunk."""
        chat = prepared.chat
        try:
            run = await self.chat.reserve_run(chat, meter)
            pieces = await run.stream()
        except BaseException:
            await self._give_back(prepared)
            raise
        return self._guarded(
            prepared, StreamWriter(prepared, self.chat.strict_arguments, self.finish), pieces, run
        )

    async def _guarded(
        self,
        prepared: PreparedResponse,
        writer: StreamWriter,
        pieces: AsyncGenerator[generation.ChoiceChunk, None],
        run: generation.GenerationRun,
    ) -> AsyncGenerator[str, None]:
        """The events; a failure after the stream began ends it with ``error`` and
        ``response.failed`` (the HTTP status is already sent)."""
        async with self._held(prepared), aclosing(writer.events(pieces, run)) as events:
            try:
                async for item in events:
                    yield item
            except Exception as exc:
                error = failure(exc, "responses")["error"]
                code, message = error["code"] or error["type"], error["message"]
                yield writer.event("error", code=code, message=message, param=None)
                failed = response_object(
                    prepared, "failed", writer.output, error={"code": code, "message": message}
                )
                yield writer.event("response.failed", response=failed)
