"""What a Responses request refers to that is stored elsewhere: ``item_reference`` input
items and ``conversation=``.

**item_reference** (``{"type": "item_reference", "id": "msg_..."}``, or ``{"id": ...}``
alone, as OpenAI's type allows): the item is looked up in the caller's own stored records,
the input items and output of its stored responses and the items of its conversations,
through the item index (:mod:`gateway.state.item_index`), and stands in the input as the
item itself. An unknown id, another key's, or one whose record was deleted or expired is a
400 ``item_not_found`` naming ``input[i].id``. The Vercel AI SDK sends its earlier
assistant messages this way on a chat's second turn.

**conversation** (``"conv_..."`` or ``{"id": "conv_..."}``): the conversation's items are the
history before the input (as ``previous_response_id``'s chain would be; the response's
``input_items`` list them first), and once the response is done (``completed`` or
``incomplete``, not ``failed``) its own input items and its output are appended to the
conversation, ``store: false`` or not (the conversation is the state the client asked
for; ``store`` is about the response object). Items already in the conversation (an
``item_reference`` to one of them) are not appended twice. With ``previous_response_id``
it is a 400 ``mutually_exclusive_parameters``, as OpenAI answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequestError, NotFoundError
from gateway.serving.responses.conversion import input_messages
from gateway.serving.responses.items import OutputItem, dump_all
from gateway.serving.responses.protocol import InputItem, PreparedResponse, ResponsesRequest
from gateway.state.conversations import ConversationStore, ConversationTurn, StoredConversation
from gateway.state.responses import ResponseStore

_FIELDS = frozenset(InputItem.model_fields)


def is_reference(item: InputItem) -> bool:
    """An ``item_reference`` item: by its type, or an id with nothing else."""
    if item.type == "item_reference":
        return True
    bare = item.model_dump(exclude_none=True, exclude={"id"})
    return item.type is None and item.id is not None and not bare


def as_input(item: dict[str, Any]) -> InputItem:
    """A stored item as an input item (the fields an input item has)."""
    return InputItem.model_validate({k: v for k, v in item.items() if k in _FIELDS})


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored items (a conversation's) as the chat messages they make."""
    return input_messages([as_input(item) for item in items], [])[0]


def conversation_id(request: ResponsesRequest) -> str | None:
    """The id ``conversation`` names, checked (None without one)."""
    value = request.conversation
    if value is None:
        return None
    if request.previous_response_id is not None:
        raise InvalidRequestError(
            "Mutually exclusive parameters: send previous_response_id or conversation, "
            "not both (a conversation holds the earlier turns itself).",
            param="conversation",
            code="mutually_exclusive_parameters",
        )
    found = value if isinstance(value, str) else value.get("id")
    if not isinstance(found, str) or not found:
        raise InvalidRequestError(
            "conversation is a conversation id ('conv_...') or an object with its id.",
            param="conversation.id" if isinstance(value, dict) else "conversation",
            code="invalid_value",
        )
    if isinstance(value, dict) and set(value) != {"id"}:
        extra = sorted(set(value) - {"id"})[0]
        raise InvalidRequestError(
            f"Unrecognized request argument supplied: conversation.{extra}",
            param=f"conversation.{extra}",
            code="unknown_parameter",
        )
    return found


@dataclass(frozen=True, slots=True)
class Continued:
    """The conversation a response continues: its place, and its items as the history."""

    turn: ConversationTurn
    conversation: StoredConversation
    messages: list[dict[str, Any]]

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.conversation.items


class References:
    """Resolves ``item_reference`` items and ``conversation=`` for the caller's key."""

    def __init__(self, responses: ResponseStore, conversations: ConversationStore) -> None:
        self.responses = responses
        self.conversations = conversations

    async def resolve(self, request: ResponsesRequest, owner: str) -> ResponsesRequest:
        """``request`` with each ``item_reference`` of its input replaced by the stored
        item (the request itself when it has none)."""
        if isinstance(request.input, str) or not any(map(is_reference, request.input)):
            return request
        items = await self.resolve_items(request.input, owner, "input")
        return request.model_copy(update={"input": items})

    async def resolve_items(
        self, items: list[InputItem], owner: str, param: str
    ) -> list[InputItem]:
        """``items`` with each ``item_reference`` replaced by the stored item; a 400
        ``item_not_found`` naming ``{param}[i].id`` for an id the caller has not stored."""
        wanted = [item.id for item in items if is_reference(item) and item.id]
        # Where each lives, in one round trip; then each record read once.
        found_at = await self.conversations.index.locate(owner, wanted)
        located = dict(zip(wanted, found_at, strict=True))
        records: dict[str, list[dict[str, Any]]] = {}
        out = []
        for index, item in enumerate(items):
            if not is_reference(item):
                out.append(item)
                continue
            item_id = item.id
            where = located.get(item_id) if item_id else None
            found = None
            if item_id and where is not None:
                if where not in records:
                    records[where] = await self._items(owner, where)
                found = next((i for i in records[where] if i.get("id") == item_id), None)
            if found is None:
                raise InvalidRequestError(
                    f"Item with id '{item_id}' not found: an item_reference names an item of "
                    "this API key's stored responses (store: true) or conversations.",
                    param=f"{param}[{index}].id",
                    code="item_not_found",
                )
            out.append(as_input(found))
        return out

    async def _items(self, owner: str, where: str) -> list[dict[str, Any]]:
        """The items of the record ``where`` (none when it is gone)."""
        kind, _, record_id = where.partition(":")
        try:
            if kind == "response":
                stored = await self.responses.get(owner, record_id)
                return [*stored.input_items, *stored.response["output"]]
            if kind == "conversation":
                return (await self.conversations.get(owner, record_id)).items
        except NotFoundError:
            pass  # deleted or expired since it was indexed
        return []

    async def conversation(self, request: ResponsesRequest, owner: str) -> Continued | None:
        """The conversation ``request`` continues (None without ``conversation``); a 404
        for an unknown or another key's id, 403 when the key may store no more."""
        found = conversation_id(request)
        if found is None:
            return None
        conversation = await self.conversations.get(owner, found)
        await self.conversations.room(owner, "conversation")
        turn = ConversationTurn(found, len(conversation.items))
        return Continued(turn, conversation, chat_messages(conversation.items))

    def check_turn(self, continued: Continued | None, items: list[dict[str, Any]]) -> None:
        """A 400 before generating when the request's input alone takes the conversation
        past its bounds (the output may still do so: the response then fails)."""
        if continued is not None:
            conversation = continued.conversation
            grown = conversation.model_copy(update={"items": [*conversation.items, *items]})
            self.conversations.check(grown, "conversation")

    async def append_turn(self, prepared: PreparedResponse, output: list[OutputItem]) -> None:
        """Appends the response's own input items and its output to its conversation."""
        turn = prepared.conversation
        if turn is None:
            return
        items = [*prepared.input_items[turn.earlier :], *dump_all(output)]
        await self.conversations.append(prepared.owner, turn.id, items, "conversation", turn=True)
