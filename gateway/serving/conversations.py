"""The Conversations API (``/v1/conversations``), as openai-python types it: a conversation
(create with items and metadata, retrieve, update its metadata, delete) and its items
(list, create, retrieve, delete), per key and stored in Redis
(:mod:`gateway.state.conversations`: the bounds and the stored bytes). ``conversation=`` on
``/v1/responses`` reads and appends to the same records
(:mod:`gateway.serving.responses.references`).

Items are the Responses API's input items, checked and stored as a response's input items
are (:func:`~gateway.serving.responses.conversion.input_messages`): messages, function calls
and their outputs (whose ``call_id`` must match a call before them in the conversation),
reasoning, and ``item_reference`` (the stored item it names is added). At most 20 items per
request, as OpenAI bounds it; ``metadata`` is 16 pairs (keys of 64 characters, values of 512).

``include`` (items list, retrieve, create): the items are kept as they were made, so
``message.output_text.logprobs`` (an answer's log probabilities, when its response asked
for them) and ``message.input_image.image_url`` (the image URLs of input messages) are
always in them and accepted; the other values name what nothing here makes (hosted tools'
results, encrypted reasoning) and are a 400 ``unsupported_parameter``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gateway.errors import InvalidRequestError
from gateway.serving.protocol import Strict
from gateway.serving.protocol.common import list_page
from gateway.serving.responses.conversion import input_messages
from gateway.serving.responses.protocol import InputItem, MetadataKey, MetadataValue
from gateway.serving.responses.references import References, chat_messages
from gateway.state.conversations import ConversationStore, StoredConversation

#: What one create request may add, as OpenAI bounds it.
MAX_ITEMS_PER_REQUEST = 20
#: The ``include`` values the stored items already answer.
INCLUDABLE = ("message.output_text.logprobs", "message.input_image.image_url")

Metadata = dict[MetadataKey, MetadataValue]


class ConversationCreate(Strict):
    items: list[InputItem] | None = Field(None, max_length=MAX_ITEMS_PER_REQUEST)
    metadata: Metadata | None = Field(None, max_length=16)


class ConversationUpdate(Strict):
    metadata: Metadata | None = Field(max_length=16)
    """Required (``null`` clears it), as the SDK types it."""


class ItemsCreate(Strict):
    items: list[InputItem] = Field(min_length=1, max_length=MAX_ITEMS_PER_REQUEST)


def check_include(include: list[str] | None) -> None:
    """A 400 for an ``include`` value the stored items cannot answer."""
    for index, value in enumerate(include or []):
        if value not in INCLUDABLE:
            raise InvalidRequestError(
                f"include '{value}' is not supported for conversation items: nothing here "
                f"makes it. Supported: {', '.join(INCLUDABLE)} (always in the items).",
                param=f"include[{index}]",
                code="unsupported_parameter",
            )


#: A page of conversation items (an OpenAI list).
item_list = list_page


class ConversationService:
    def __init__(self, store: ConversationStore, references: References) -> None:
        self.store = store
        self.references = references

    async def _stored_items(
        self, items: list[InputItem], owner: str, before: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """``items`` as the conversation keeps them (with ids), checked as a response's
        input is, after the items ``before`` them; errors name ``items[i]``."""
        try:
            given = await self.references.resolve_items(items, owner, "input")
            return input_messages(given, chat_messages(before))[1]
        except InvalidRequestError as exc:  # checked as input: name the parameter sent
            if exc.param is not None and exc.param.startswith("input"):
                exc.param = "items" + exc.param.removeprefix("input")
            raise

    async def create(self, owner: str, body: ConversationCreate) -> dict[str, Any]:
        items = await self._stored_items(body.items or [], owner, [])
        conversation = await self.store.create(owner, dict(body.metadata or {}), items)
        return conversation.public()

    async def get(self, owner: str, conversation_id: str) -> StoredConversation:
        """The caller's conversation, or a 404."""
        return await self.store.get(owner, conversation_id)

    async def update(
        self, owner: str, conversation_id: str, body: ConversationUpdate
    ) -> dict[str, Any]:
        metadata = dict(body.metadata or {})
        return (await self.store.update(owner, conversation_id, metadata)).public()

    async def delete(self, owner: str, conversation_id: str) -> dict[str, Any]:
        await self.store.delete(owner, conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def list_items(
        self,
        owner: str,
        conversation_id: str,
        limit: int,
        order: Literal["asc", "desc"],
        after: str | None,
        include: list[str] | None,
    ) -> dict[str, Any]:
        """A page of the items, newest first by default, after the item ``after``."""
        check_include(include)
        items = (await self.store.get(owner, conversation_id)).items
        if order == "desc":
            items = items[::-1]
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise InvalidRequestError(
                    f"No item with id '{after}' in this conversation.",
                    param="after",
                    code="invalid_value",
                )
            items = items[ids.index(after) + 1 :]
        return item_list(items[:limit], has_more=len(items) > limit)

    async def add_items(
        self, owner: str, conversation_id: str, body: ItemsCreate, include: list[str] | None
    ) -> dict[str, Any]:
        """Appends the items; the list of those added, oldest first."""
        check_include(include)
        before = (await self.store.get(owner, conversation_id)).items
        items = await self._stored_items(body.items, owner, before)
        await self.store.append(owner, conversation_id, items, "items")
        return item_list(items)

    async def get_item(
        self, owner: str, conversation_id: str, item_id: str, include: list[str] | None
    ) -> dict[str, Any]:
        check_include(include)
        return (await self.store.get(owner, conversation_id)).item(item_id)

    async def delete_item(self, owner: str, conversation_id: str, item_id: str) -> dict[str, Any]:
        """Deletes the item; the conversation, as the SDK types the answer."""
        return (await self.store.remove_item(owner, conversation_id, item_id)).public()
