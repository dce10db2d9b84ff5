"""Conversations of ``/v1/conversations``: a list of items (messages, function calls and
their outputs, reasoning) with metadata, that ``conversation=`` on ``/v1/responses`` reads as
the history before its input and appends its input and output to. Kept in Redis so any
replica serves any conversation.

A conversation is one record (``gw:conversation:<key id>:<conv id>``) of the key that made
it, kept ``responses_ttl_s`` seconds after its last change. Another key's conversation does
not exist for a caller, exactly as an unknown id (404); ids carry 192 random bits. Changes
(new items, metadata, an item deleted) are optimistic transactions (``WATCH``): two
replicas appending at once both land, in some order.

**Bounds.** A record is at most ``max_stored_kb`` KB of JSON and holds at most
``max_conversation_items`` items; a change past either is refused with a 400
(``stored_record_too_large``, ``too_many_items``) and changes nothing. Each record counts
towards its key's (and project's) stored bytes (:mod:`gateway.state.stored_bytes`) with the
index entries of its items (:mod:`gateway.state.item_index`): a change through the API that
grows the record (items, metadata) holds the room it adds first (403
``storage_quota_exceeded`` past a quota); a response's turn checks that the key has room
before generating, and its write is never refused for the quota (the answer was paid for),
as a session's. A delete racing a change wins: the change finds the conversation gone (a
404) and counts nothing, and index entries it wrote meanwhile are removed again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import WatchError

from gateway.config import Settings
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.state.item_index import ItemIndex, entry_bytes
from gateway.state.redis import PREFIX, needs_store
from gateway.state.responses import new_id
from gateway.state.stored_bytes import Hold, StoredBytes, bounded_json

DEFAULT_MAX_STORED_KB: int = Settings.model_fields["max_stored_kb"].default
DEFAULT_MAX_ITEMS: int = Settings.model_fields["max_conversation_items"].default
#: What a client may do instead when a key's stored bytes are full.
_INSTEAD = "delete conversations (DELETE /v1/conversations/{id})"


class StoredConversation(BaseModel):
    owner: str
    id: str
    created_at: int
    metadata: dict[str, str] = {}
    items: list[dict[str, Any]] = []
    """The items, oldest first, as the API lists them (each with its id)."""

    def public(self) -> dict[str, Any]:
        """The conversation object as the API returns it."""
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }

    def item(self, item_id: str) -> dict[str, Any]:
        """The item ``item_id``, or a 404."""
        for item in self.items:
            if item.get("id") == item_id:
                return item
        raise NotFoundError(
            f"Item with id '{item_id}' not found in conversation '{self.id}'.", param="item_id"
        )


@dataclass(frozen=True, slots=True)
class ConversationTurn:
    """A response's place in a conversation (``conversation=``): the conversation's id, and
    how many of the response's input items are the conversation's (the rest are the
    request's own input, appended to it with the output when the response is done)."""

    id: str
    earlier: int


def not_found(conversation_id: str) -> NotFoundError:
    return NotFoundError(
        f"Conversation with id '{conversation_id}' not found.", param="conversation_id"
    )


def location(conversation_id: str) -> str:
    """The conversation's name in the stored bytes and in the item index."""
    return f"conversation:{conversation_id}"


class ConversationStore:
    def __init__(
        self,
        redis: Redis,
        ttl_s: int,
        max_stored_kb: int = DEFAULT_MAX_STORED_KB,
        max_items: int = DEFAULT_MAX_ITEMS,
        stored_bytes: StoredBytes | None = None,
    ) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.max_stored_kb = max_stored_kb
        self.max_items = max_items
        self.stored_bytes = stored_bytes or StoredBytes(redis)
        self.index = ItemIndex(redis, self.stored_bytes)

    @staticmethod
    def _key(owner: str, conversation_id: str) -> str:
        return f"{PREFIX}conversation:{owner}:{conversation_id}"

    def check(self, conversation: StoredConversation, param: str) -> str:
        """The record as it is stored, or a 400 naming ``param`` when it holds more than
        ``max_conversation_items`` items or more than ``max_stored_kb`` KB of JSON."""
        count = len(conversation.items)
        if count > self.max_items:
            raise InvalidRequestError(
                f"With these items the conversation would hold {count} items; the gateway "
                f"keeps at most {self.max_items} per conversation "
                "(GATEWAY_MAX_CONVERSATION_ITEMS). Delete items, or start a new conversation.",
                param=param,
                code="too_many_items",
            )
        return bounded_json(
            conversation,
            self.max_stored_kb,
            param,
            "With these items the conversation would be",
            "Delete items, or start a new conversation.",
        )

    def _counted(self, conversation: StoredConversation, raw: str) -> int:
        """What the record counts for in stored bytes: its JSON and its index entries."""
        ids = [str(item["id"]) for item in conversation.items]
        where = location(conversation.id)
        return len(raw.encode()) + entry_bytes(conversation.owner, where, ids)

    async def room(self, owner: str, param: str) -> None:
        """Refused (403 ``storage_quota_exceeded``, 503 ``store_full``) when ``owner`` may
        store no more: what a response's turn checks before generating."""
        await self.stored_bytes.hold(owner, "conversation", 0, param, _INSTEAD)

    @needs_store
    async def create(
        self, owner: str, metadata: dict[str, str], items: list[dict[str, Any]]
    ) -> StoredConversation:
        """A new conversation of ``owner``, stored (bounds and quota checked first)."""
        conversation = StoredConversation(
            owner=owner,
            id=new_id("conv"),
            created_at=int(time.time()),
            metadata=metadata,
            items=items,
        )
        seen: set[str] = set()
        for index, item in enumerate(items):
            if str(item["id"]) in seen:
                raise InvalidRequestError(
                    f"Two items have the id '{item['id']}'.",
                    param=f"items[{index}].id",
                    code="duplicate_item_id",
                )
            seen.add(str(item["id"]))
        raw = self.check(conversation, "items")
        where = location(conversation.id)
        size = self._counted(conversation, raw)
        hold = await self.stored_bytes.hold(owner, where, size, "items", _INSTEAD)
        await self.stored_bytes.put(owner, where, size, self.ttl_s, hold)
        await self.redis.set(self._key(owner, conversation.id), raw, ex=self.ttl_s)
        await self.index.point(owner, where, [str(i["id"]) for i in items], self.ttl_s)
        return conversation

    @needs_store
    async def get(self, owner: str, conversation_id: str) -> StoredConversation:
        """The caller's conversation, or a 404."""
        raw = await self.redis.get(self._key(owner, conversation_id))
        if raw is None:
            raise not_found(conversation_id)
        return StoredConversation.model_validate_json(raw)

    async def update(
        self, owner: str, conversation_id: str, metadata: dict[str, str]
    ) -> StoredConversation:
        """Replaces the conversation's metadata."""

        def change(conversation: StoredConversation) -> None:
            conversation.metadata = metadata

        return await self._change(owner, conversation_id, change, "metadata", hold=True)

    async def append(
        self,
        owner: str,
        conversation_id: str,
        items: list[dict[str, Any]],
        param: str,
        turn: bool = False,
    ) -> StoredConversation:
        """Appends ``items`` (a 400 naming ``param`` past a bound). Through the API
        (``turn`` False) the room they add is held first (403 past a quota) and an id the
        conversation already holds is a 400 ``duplicate_item_id``; a response's turn (its
        room checked before generating) skips the items the conversation already holds
        (an ``item_reference`` to one of them)."""

        def change(conversation: StoredConversation) -> None:
            known = {str(item["id"]) for item in conversation.items}
            added = []
            for index, item in enumerate(items):
                if str(item["id"]) in known:
                    if turn:
                        continue
                    raise InvalidRequestError(
                        f"The conversation already holds an item with id '{item['id']}'.",
                        param=f"{param}[{index}].id",
                        code="duplicate_item_id",
                    )
                known.add(str(item["id"]))
                added.append(item)
            conversation.items = [*conversation.items, *added]

        return await self._change(owner, conversation_id, change, param, hold=not turn)

    async def remove_item(
        self, owner: str, conversation_id: str, item_id: str
    ) -> StoredConversation:
        """Deletes one item (a 404 when the conversation has none of that id)."""

        def change(conversation: StoredConversation) -> None:
            conversation.item(item_id)
            conversation.items = [i for i in conversation.items if i.get("id") != item_id]

        conversation = await self._change(owner, conversation_id, change, "item_id")
        await self.index.forget(owner, location(conversation_id), [item_id])
        return conversation

    @needs_store
    async def _change(
        self,
        owner: str,
        conversation_id: str,
        change: Callable[[StoredConversation], None],
        param: str,
        hold: bool = False,
    ) -> StoredConversation:
        """Reads, changes (``change`` may raise) and writes the conversation in one
        optimistic transaction, counting its new size (after holding what it adds, with
        ``hold``), and renews its items' index entries. A delete landing meanwhile wins:
        the retry finds no conversation and stops counting what this change counted."""
        key = self._key(owner, conversation_id)
        where = location(conversation_id)
        held: Hold | None = None
        counted = False
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        await pipe.watch(key)
                        raw = await pipe.get(key)
                        if raw is None:
                            if counted:  # deleted after this change counted it
                                await self.stored_bytes.drop(owner, where)
                            raise not_found(conversation_id)
                        before = StoredConversation.model_validate_json(raw)
                        conversation = before.model_copy(deep=True)
                        change(conversation)
                        raw = self.check(conversation, param)
                        size = self._counted(conversation, raw)
                        if hold and held is None:
                            grown = size - self._counted(before, before.model_dump_json())
                            if grown > 0:
                                held = await self.stored_bytes.hold(
                                    owner, where, grown, param, _INSTEAD
                                )
                        await self.stored_bytes.put(owner, where, size, self.ttl_s, held)
                        held, counted = None, True  # counted in the record's entry now
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.set(key, raw, ex=self.ttl_s)
                        await pipe.execute()
                        break
                    except WatchError:
                        continue
        finally:
            await self.stored_bytes.release(held)
        ids = [str(item["id"]) for item in conversation.items]
        await self.index.point(owner, where, ids, self.ttl_s, record=key)
        return conversation

    @needs_store
    async def delete(self, owner: str, conversation_id: str) -> None:
        """Deletes the caller's conversation (a 404 when there is none), its items' index
        entries, and gives back the bytes it took."""
        key = self._key(owner, conversation_id)
        raw = await self.redis.get(key)
        if raw is None or not await self.redis.delete(key):
            raise not_found(conversation_id)
        where = location(conversation_id)
        await self.stored_bytes.drop(owner, where)
        conversation = StoredConversation.model_validate_json(raw)
        await self.index.forget(owner, where, [str(item["id"]) for item in conversation.items])
