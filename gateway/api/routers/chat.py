"""/v1/chat/completions: create (stream or not; ``store: true`` keeps it), and the stored
completions of the caller's key: list, retrieve, update, delete, list messages."""

from __future__ import annotations

import re
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse

from gateway.api.auth import AdmissionDep, CallerDep
from gateway.api.dependencies import ServicesDep
from gateway.api.disconnect import cancel_on_disconnect
from gateway.api.inference import inference
from gateway.backend import scheduling
from gateway.serving.protocol import ChatCompletion, ChatCompletionRequest
from gateway.serving.sse import SSE_HEADERS
from gateway.serving.stored_chat import StoredChatUpdate

router = APIRouter(prefix="/v1", tags=["chat"])

SessionHeader = Annotated[
    str | None,
    Header(
        alias="X-Session-ID",
        description="Continue this stored conversation (created on first use).",
    ),
]


@router.post(
    "/chat/completions",
    response_model=None,
    responses={200: {"model": ChatCompletion, "description": "A completion, or SSE chunks"}},
)
@inference
async def create_chat_completion(
    body: ChatCompletionRequest,
    services: ServicesDep,
    request: Request,
    admission: AdmissionDep,
    session_id: SessionHeader = None,
) -> Response:
    meter = admission.use_model(body.model)
    priority = admission.key.request_priority(body.priority)
    scheduling.start(priority, session_id, body.prompt_cache_key)
    guard = partial(cancel_on_disconnect, request)
    reply = await services.chat_completions.create(body, admission.key, meter, session_id, guard)
    if isinstance(reply.body, str):
        return Response(reply.body, media_type="application/json", headers=reply.headers)
    headers = {**SSE_HEADERS, **reply.headers}
    return StreamingResponse(reply.body, media_type="text/event-stream", headers=headers)


#: ``metadata[<key>]=<value>`` query parameters (the SDK's encoding of ``metadata``).
_METADATA_PARAM = re.compile(r"metadata\[(.+)\]")


@router.get("/chat/completions")
async def list_chat_completions(
    request: Request,
    caller: CallerDep,
    services: ServicesDep,
    model: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "asc",
) -> dict[str, Any]:
    """The caller's stored chat completions (oldest first by default), of ``model`` and with
    every ``metadata[k]=v`` pair given, paginated as OpenAI lists are (``after`` an id)."""
    metadata = {
        found.group(1): value
        for name, value in request.query_params.multi_items()
        if (found := _METADATA_PARAM.fullmatch(name))
    }
    return await services.stored_chat.list(caller.id, model, metadata, after, limit, order)


@router.get("/chat/completions/{completion_id}")
async def get_chat_completion(
    completion_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    """A stored completion of the caller's key; 404 for another key's or an unknown id."""
    return await services.stored_chat.retrieve(caller.id, completion_id)


@router.post("/chat/completions/{completion_id}")
async def update_chat_completion(
    completion_id: str, body: StoredChatUpdate, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    """Replaces a stored completion's metadata (``null``: none)."""
    return await services.stored_chat.update(caller.id, completion_id, body.metadata)


@router.delete("/chat/completions/{completion_id}")
async def delete_chat_completion(
    completion_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    return await services.stored_chat.delete(caller.id, completion_id)


@router.get("/chat/completions/{completion_id}/messages")
async def list_chat_completion_messages(
    completion_id: str,
    caller: CallerDep,
    services: ServicesDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "asc",
) -> dict[str, Any]:
    """The messages of a stored completion's request, paginated (``after`` a message id)."""
    return await services.stored_chat.messages(caller.id, completion_id, after, limit, order)
