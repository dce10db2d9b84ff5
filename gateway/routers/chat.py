"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from gateway.chat import SSE_HEADERS
from gateway.dependencies import ChatDep
from gateway.protocol import ChatCompletion, ChatCompletionRequest

router = APIRouter(prefix="/v1", tags=["chat"])


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, chat: ChatDep
) -> ChatCompletion | StreamingResponse:
    prepared = await chat.prepare(body)
    if body.stream:
        events = await chat.stream(prepared)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    return await chat.complete(prepared)
