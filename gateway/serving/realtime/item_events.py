"""A session's conversation items: ``conversation.item.create`` (a message, a function
call, a function call's output; an ``input_audio`` part transcribed on the work queue),
``delete``, ``retrieve`` and ``truncate``, and the user item a spoken turn adds."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.serving.realtime.buffer import Audio
from gateway.serving.realtime.context import SessionContext
from gateway.serving.realtime.conversation import Conversation
from gateway.serving.realtime.items import Item
from gateway.serving.realtime.protocol import (
    ClientEventError,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
)
from gateway.serving.realtime.transcriber import Transcriber, TranscriptionRequest


class ItemEvents:
    def __init__(
        self, ctx: SessionContext, conversation: Conversation, transcriber: Transcriber
    ) -> None:
        self.ctx = ctx
        self.conversation = conversation
        self.transcriber = transcriber

    def handlers(self) -> dict[type[Any], Any]:
        return {
            ItemCreate: self.create,
            ItemDelete: self.delete,
            ItemRetrieve: self.retrieve,
            ItemTruncate: self.truncate,
        }

    async def create(self, event: ItemCreate) -> None:
        conversation = self.conversation
        item, audio = await conversation.item(event.item, "item", self.ctx.config.input_format)
        if any(existing.id == item.id for existing in conversation.items):
            raise ClientEventError(f"Item '{item.id}' already exists.", param="item.id")
        previous = event.previous_item_id
        position = len(conversation.items)
        if previous == "root":
            position = 0
        elif previous:
            position = conversation.index(previous, "previous_item_id") + 1
        if audio is not None:
            self.ctx.jobs.check_room()
        await conversation.insert(item, position)
        if audio is None:
            await self.ctx.emit("conversation.item.done", item=item.to_json())
        else:
            self.ctx.jobs.put(lambda: self._transcribed(item, audio, None, None))
        await conversation.keep_bounded()

    async def delete(self, event: ItemDelete) -> None:
        await self.conversation.delete(event.item_id)

    async def retrieve(self, event: ItemRetrieve) -> None:
        await self.conversation.retrieve(event.item_id)

    async def truncate(self, event: ItemTruncate) -> None:
        await self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms)

    async def commit_turn(
        self,
        item_id: str,
        audio: Audio,
        early: asyncio.Task[str | None] | None,
        request: TranscriptionRequest | None,
    ) -> None:
        """A turn's audio becomes a user item, transcribed on the work queue (by the guess
        ``early`` if it heard it all, under the turn's ``request`` if its guesses made one)."""
        try:
            self.ctx.jobs.check_room()
        except ClientEventError:
            if early is not None:
                early.cancel()
            if request is not None:
                await request.finish()
            raise
        item = Item(item_id, "user", [{"type": "input_audio", "transcript": None}], "completed")
        previous = self.conversation.last_id()
        await self.ctx.emit(
            "input_audio_buffer.committed", item_id=item_id, previous_item_id=previous
        )
        await self.conversation.append(item)
        self.ctx.jobs.put(lambda: self._transcribed(item, audio, early, request))
        await self.conversation.keep_bounded()

    async def _transcribed(
        self,
        item: Item,
        audio: Audio,
        early: asyncio.Task[str | None] | None,
        request: TranscriptionRequest | None,
    ) -> None:
        await self.transcriber.item(item, audio, early, request)
        await self.ctx.emit("conversation.item.done", item=item.to_json())
        await self.conversation.keep_bounded()
