"""/v1/conversations: create, retrieve, update, delete; its items: list, create, retrieve,
delete (the caller's own; another key's conversation is a 404)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from gateway.api.auth import CallerDep
from gateway.api.dependencies import ServicesDep
from gateway.serving.conversations import ConversationCreate, ConversationUpdate, ItemsCreate

router = APIRouter(prefix="/v1/conversations", tags=["conversations"])

# The SDKs send a list as ``include[]=...`` (repeated); ``include=...`` is taken too.
IncludeDep = Annotated[list[str] | None, Query(alias="include[]")]
PlainIncludeDep = Annotated[list[str] | None, Query(alias="include")]


def _include(brackets: list[str] | None, plain: list[str] | None) -> list[str] | None:
    return [*(brackets or []), *(plain or [])] or None


@router.post("")
async def create_conversation(
    body: ConversationCreate, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    return await services.conversations.create(caller.id, body)


@router.get("/{conversation_id}")
async def get_conversation(
    conversation_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    return (await services.conversations.get(caller.id, conversation_id)).public()


@router.post("/{conversation_id}")
async def update_conversation(
    conversation_id: str, body: ConversationUpdate, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    return await services.conversations.update(caller.id, conversation_id, body)


@router.delete("/{conversation_id}")
async def delete_conversation(
    conversation_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    return await services.conversations.delete(caller.id, conversation_id)


@router.get("/{conversation_id}/items")
async def list_items(
    conversation_id: str,
    caller: CallerDep,
    services: ServicesDep,
    include: IncludeDep = None,
    include_plain: PlainIncludeDep = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> dict[str, Any]:
    """The items, newest first by default, paginated as OpenAI lists are (``after`` an
    item id)."""
    wanted = _include(include, include_plain)
    return await services.conversations.list_items(
        caller.id, conversation_id, limit, order, after, wanted
    )


@router.post("/{conversation_id}/items")
async def create_items(
    conversation_id: str,
    body: ItemsCreate,
    caller: CallerDep,
    services: ServicesDep,
    include: IncludeDep = None,
    include_plain: PlainIncludeDep = None,
) -> dict[str, Any]:
    wanted = _include(include, include_plain)
    return await services.conversations.add_items(caller.id, conversation_id, body, wanted)


@router.get("/{conversation_id}/items/{item_id}")
async def get_item(
    conversation_id: str,
    item_id: str,
    caller: CallerDep,
    services: ServicesDep,
    include: IncludeDep = None,
    include_plain: PlainIncludeDep = None,
) -> dict[str, Any]:
    wanted = _include(include, include_plain)
    return await services.conversations.get_item(caller.id, conversation_id, item_id, wanted)


@router.delete("/{conversation_id}/items/{item_id}")
async def delete_item(
    conversation_id: str, item_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    """Deletes the item; answers the conversation."""
    return await services.conversations.delete_item(caller.id, conversation_id, item_id)
