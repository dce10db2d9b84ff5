"""/v1/conversations: create, retrieve, update, delete; its items: list, create, retrieve,
delete (the caller's own; another key's conversation is a 404)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query

from gateway.api.auth import CallerDep
from gateway.api.dependencies import ServicesDep
from gateway.serving.conversations import ConversationCreate, ConversationUpdate, ItemsCreate

router = APIRouter(prefix="/v1/conversations", tags=["conversations"])


def _include(
    brackets: Annotated[list[str] | None, Query(alias="include[]")] = None,
    plain: Annotated[list[str] | None, Query(alias="include")] = None,
) -> list[str] | None:
    """``include``: the SDKs send a list as ``include[]=...`` (repeated); ``include=...`` is
    taken too."""
    return [*(brackets or []), *(plain or [])] or None


IncludeDep = Annotated[list[str] | None, Depends(_include)]


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
    include: IncludeDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> dict[str, Any]:
    """The items, newest first by default, paginated as OpenAI lists are (``after`` an
    item id)."""
    return await services.conversations.list_items(
        caller.id, conversation_id, limit, order, after, include
    )


@router.post("/{conversation_id}/items")
async def create_items(
    conversation_id: str,
    body: ItemsCreate,
    caller: CallerDep,
    services: ServicesDep,
    include: IncludeDep,
) -> dict[str, Any]:
    return await services.conversations.add_items(caller.id, conversation_id, body, include)


@router.get("/{conversation_id}/items/{item_id}")
async def get_item(
    conversation_id: str,
    item_id: str,
    caller: CallerDep,
    services: ServicesDep,
    include: IncludeDep,
) -> dict[str, Any]:
    return await services.conversations.get_item(caller.id, conversation_id, item_id, include)


@router.delete("/{conversation_id}/items/{item_id}")
async def delete_item(
    conversation_id: str, item_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    """Deletes the item; answers the conversation."""
    return await services.conversations.delete_item(caller.id, conversation_id, item_id)
