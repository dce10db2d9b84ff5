"""/v1/responses: create (stream or not), retrieve, list input items, delete."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from gateway.api.auth import AdmissionDep, CallerDep
from gateway.api.dependencies import ServicesDep
from gateway.api.disconnect import cancel_on_disconnect
from gateway.backend import scheduling
from gateway.errors import InvalidRequestError
from gateway.serving.responses import ResponsesRequest
from gateway.serving.sse import SSE_HEADERS

router = APIRouter(prefix="/v1/responses", tags=["responses"])


@router.post("", response_model=None)
async def create_response(
    body: ResponsesRequest, services: ServicesDep, request: Request, admission: AdmissionDep
) -> Response:
    meter = admission.use_model(body.model)
    priority = admission.key.request_priority(body.priority)
    responses = services.responses
    prepared = await responses.prepare(body, owner=admission.key.id)
    scheduling.start(priority, prepared.root, body.prompt_cache_key)
    if body.stream:
        events = await responses.stream(prepared, meter)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    response = await cancel_on_disconnect(request, responses.create(prepared, meter))
    return Response(json.dumps(response), media_type="application/json")


@router.get("/{response_id}")
async def get_response(response_id: str, caller: CallerDep, services: ServicesDep) -> Any:
    """A stored response of the caller's key; 404 for another key's or an unknown id."""
    return (await services.responses.store.get(caller.id, response_id)).response


@router.get("/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    caller: CallerDep,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> dict[str, Any]:
    """The conversation the response answered, as items: with ``previous_response_id``, the
    earlier inputs and outputs, then its own input (newest first by default), paginated as
    OpenAI lists are (``after`` an item id)."""
    items = (await services.responses.store.get(caller.id, response_id)).input_items
    if order == "desc":
        items = items[::-1]
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise InvalidRequestError(f"No input item with id '{after}'.", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


@router.delete("/{response_id}")
async def delete_response(
    response_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    await services.responses.store.delete(caller.id, response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
