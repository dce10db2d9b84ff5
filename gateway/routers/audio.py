"""POST /v1/audio/speech."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from gateway.chat import SSE_HEADERS
from gateway.dependencies import SpeechDep
from gateway.protocol import SpeechRequest

router = APIRouter(prefix="/v1/audio", tags=["audio"])


@router.post(
    "/speech",
    response_class=StreamingResponse,
    responses={200: {"content": {"audio/mpeg": {}}, "description": "Audio, streamed"}},
)
async def create_speech(body: SpeechRequest, speech: SpeechDep) -> StreamingResponse:
    prepared = await speech.prepare(body)
    audio = await speech.stream(prepared)
    headers = SSE_HEADERS if prepared.sse else {"X-Accel-Buffering": "no"}
    return StreamingResponse(audio, media_type=prepared.content_type, headers=headers)
