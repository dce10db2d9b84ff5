"""/v1/responses: create (stream or not, in the background or not), retrieve (a background
response's events too), cancel, list input items, delete."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from gateway.api.auth import AdmissionDep, CallerDep
from gateway.api.dependencies import ServicesDep
from gateway.api.disconnect import cancel_on_disconnect
from gateway.api.inference import inference
from gateway.backend import scheduling
from gateway.errors import InvalidRequestError
from gateway.serving.protocol.common import list_page
from gateway.serving.responses import ResponsesRequest
from gateway.serving.sse import SSE_HEADERS

router = APIRouter(prefix="/v1/responses", tags=["responses"])
#: The largest ``starting_after`` (an event log's entry ids are 64-bit: this one is far
#: past any response's last event).
MAX_SEQUENCE_NUMBER = 2**63 - 1


@router.post("", response_model=None)
@inference
async def create_response(
    body: ResponsesRequest, services: ServicesDep, request: Request, admission: AdmissionDep
) -> Response:
    meter = admission.use_model(body.model)
    priority = admission.key.request_priority(body.priority)
    responses = services.responses
    prepared = await responses.prepare(body, owner=admission.key.id)
    scheduling.start(priority, prepared.root, body.prompt_cache_key)
    if body.background:
        background = services.background
        queued = await background.start(prepared, admission)
        if body.stream:
            events = await background.follow(admission.key.id, prepared.id, None)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        return Response(json.dumps(queued), media_type="application/json")
    if body.stream:
        events = await responses.stream(prepared, meter)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    response = await cancel_on_disconnect(request, responses.create(prepared, meter))
    return Response(json.dumps(response), media_type="application/json")


@router.get("/{response_id}", response_model=None)
async def get_response(
    response_id: str,
    caller: CallerDep,
    services: ServicesDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1, le=MAX_SEQUENCE_NUMBER)] = None,
    include_obfuscation: bool = False,
) -> Any:
    """A stored response of the caller's key as it stands (404 for another key's or an
    unknown id); with ``stream``, a background response's events after ``starting_after``,
    then the rest as they come."""
    if include_obfuscation:
        raise InvalidRequestError(
            "Stream obfuscation is not supported by this gateway; set it to false.",
            param="include_obfuscation",
            code="unsupported_parameter",
        )
    if stream:
        events = await services.background.follow(caller.id, response_id, starting_after)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    return await services.background.current(caller.id, response_id)


@router.post("/{response_id}/cancel")
async def cancel_response(response_id: str, caller: CallerDep, services: ServicesDep) -> Any:
    """Cancels a background response of the caller's key; one that has ended is returned
    as it is."""
    return await services.background.cancel(caller.id, response_id)


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
    return list_page(items[:limit], len(items) > limit)


@router.delete("/{response_id}")
async def delete_response(
    response_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    """Deletes a stored response of the caller's key (a background one stopped, its events
    deleted with it)."""
    await services.background.delete(caller.id, response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
