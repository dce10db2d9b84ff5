"""/v1/messages (Anthropic's Messages API, streamed or not) and its count_tokens."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway.api.auth import AdmissionDep
from gateway.api.dependencies import ServicesDep
from gateway.api.disconnect import cancel_on_disconnect
from gateway.api.inference import inference
from gateway.backend import scheduling
from gateway.serving.messages import CountTokensRequest, MessagesRequest
from gateway.serving.sse import SSE_HEADERS

router = APIRouter(prefix="/v1/messages", tags=["messages"])


@router.post("", response_model=None)
@inference
async def create_message(
    body: MessagesRequest, services: ServicesDep, request: Request, admission: AdmissionDep
) -> Response:
    meter = admission.use_model(body.model)
    scheduling.start(admission.key.request_priority(None))
    messages = services.messages
    prepared = await messages.prepare(body, owner=admission.key.id)
    if body.stream:
        events = await messages.stream(prepared, meter)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    message = await cancel_on_disconnect(request, messages.create(prepared, meter))
    return Response(json.dumps(message), media_type="application/json")


@router.post("/count_tokens")
async def count_tokens(
    body: CountTokensRequest, services: ServicesDep, admission: AdmissionDep
) -> dict[str, Any]:
    """The prompt's input tokens, without generating (the model's tokenizer where one is
    mounted, else an estimate: ``estimated`` says which)."""
    admission.use_model(body.model)
    return await services.messages.count_tokens(body, owner=admission.key.id)
