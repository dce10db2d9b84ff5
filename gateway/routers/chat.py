"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway.dependencies import ChatDep
from gateway.disconnect import cancel_on_disconnect
from gateway.protocol import ChatCompletion, ChatCompletionRequest
from gateway.sse import SSE_HEADERS

router = APIRouter(prefix="/v1", tags=["chat"])


@router.post(
    "/chat/completions",
    response_model=None,
    responses={200: {"model": ChatCompletion, "description": "A completion, or SSE chunks"}},
)
async def create_chat_completion(
    body: ChatCompletionRequest, chat: ChatDep, request: Request
) -> Response:
    prepared = await chat.prepare(body)
    if body.stream:
        events = await chat.stream(prepared)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    completion = await cancel_on_disconnect(request, chat.complete(prepared))
    # Serialized by pydantic-core directly: FastAPI's generic encoder costs more per call.
    return Response(completion.model_dump_json(), media_type="application/json")
