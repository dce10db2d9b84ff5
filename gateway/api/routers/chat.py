"""POST /v1/chat/completions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response, StreamingResponse

from gateway.api.auth import AdmissionDep
from gateway.api.dependencies import ServicesDep
from gateway.api.disconnect import cancel_on_disconnect
from gateway.backend import scheduling
from gateway.serving.audio_chat import AudioChat
from gateway.serving.protocol import ChatCompletion, ChatCompletionRequest
from gateway.serving.sse import SSE_HEADERS

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
    chat, audio_chat = services.chat, services.audio_chat
    audio = AudioChat.involved(body)
    if audio:
        await services.catalog.get(body.model, "chat")  # a 404 before any audio is heard
        resolved = audio_chat.resolve_inputs(body, admission.key, meter)
        body = await cancel_on_disconnect(request, resolved)
    prepared = await chat.prepare(body, session_id, owner=admission.key.id)
    headers = {"X-Session-ID": session_id} if session_id else {}
    if audio and body.wants_audio():
        if body.stream:
            events = await audio_chat.stream(prepared, body, admission.key, meter)
            return StreamingResponse(
                events, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
            )
        spoken = await cancel_on_disconnect(
            request, audio_chat.complete(prepared, body, admission.key, meter)
        )
        return Response(spoken.model_dump_json(), media_type="application/json", headers=headers)
    if body.stream:
        events = await chat.stream(prepared, meter)
        return StreamingResponse(
            events, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
        )
    completion = await cancel_on_disconnect(request, chat.complete(prepared, meter))
    # Serialized by pydantic-core directly: FastAPI's generic encoder costs more per call.
    return Response(completion.model_dump_json(), media_type="application/json", headers=headers)
