"""POST /v1/audio/speech, /v1/audio/transcriptions (multipart) and /v1/audio/translations."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request, UploadFile
from fastapi.responses import Response, StreamingResponse
from pydantic import Field

from gateway.api.auth import AdmissionDep
from gateway.api.dependencies import ServicesDep
from gateway.api.disconnect import cancel_on_disconnect
from gateway.api.inference import inference
from gateway.errors import PayloadTooLargeError
from gateway.serving.audio import UPLOAD_FORMATS
from gateway.serving.protocol import SpeechRequest, TranscriptionRequest, TranslationRequest
from gateway.serving.sse import SSE_HEADERS

router = APIRouter(prefix="/v1/audio", tags=["audio"])
_FILE = f"The audio file: {', '.join(UPLOAD_FORMATS[:-1])} or {UPLOAD_FORMATS[-1]}"


class TranscriptionForm(TranscriptionRequest):
    """The whole multipart form, so that a field it does not declare is refused too."""

    file: UploadFile = Field(description=_FILE)


class TranslationForm(TranslationRequest):
    """The whole multipart form of a translation (a field it does not declare is refused)."""

    file: UploadFile = Field(description=_FILE)


@router.post(
    "/speech",
    response_class=StreamingResponse,
    responses={200: {"content": {"audio/mpeg": {}}, "description": "Audio, streamed"}},
)
@inference
async def create_speech(
    body: SpeechRequest, services: ServicesDep, admission: AdmissionDep
) -> StreamingResponse:
    meter = admission.use_model(body.model)
    speech = services.speech
    prepared = await speech.prepare(body)
    audio = await speech.stream(prepared, meter)
    headers = SSE_HEADERS if prepared.sse else {"X-Accel-Buffering": "no"}
    return StreamingResponse(audio, media_type=prepared.content_type, headers=headers)


@router.post(
    "/transcriptions",
    response_class=Response,
    responses={200: {"content": {"application/json": {}, "text/plain": {}}}},
)
@inference
async def create_transcription(
    services: ServicesDep,
    admission: AdmissionDep,
    request: Request,
    form: Annotated[TranscriptionForm, Form()],
) -> Response:
    meter = admission.use_model(form.model)
    transcriber = services.transcription
    upload = await _upload(form.file, services.settings.max_audio_upload_mb)
    job = await cancel_on_disconnect(request, transcriber.prepare(form, upload))
    if form.stream:
        events = await transcriber.stream(job, meter)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    body, media_type = await cancel_on_disconnect(request, transcriber.complete(job, meter))
    return Response(body, media_type=media_type)


@router.post(
    "/translations",
    response_class=Response,
    responses={200: {"content": {"application/json": {}, "text/plain": {}}}},
)
@inference
async def create_translation(
    services: ServicesDep,
    admission: AdmissionDep,
    request: Request,
    form: Annotated[TranslationForm, Form()],
) -> Response:
    """Speech in any language the model knows, as English text (OpenAI's parameters only)."""
    meter = admission.use_model(form.model)
    transcriber = services.transcription
    upload = await _upload(form.file, services.settings.max_audio_upload_mb)
    job = await cancel_on_disconnect(request, transcriber.prepare_translation(form, upload))
    body, media_type = await cancel_on_disconnect(request, transcriber.complete(job, meter))
    return Response(body, media_type=media_type)


async def _upload(file: UploadFile, limit_mb: float) -> bytes:
    """The uploaded file's bytes; 413 naming ``file`` over ``limit_mb``."""
    limit = int(limit_mb * 1024 * 1024)
    if file.size is not None and file.size > limit:
        raise PayloadTooLargeError(
            f"The audio file is {file.size / 1e6:.1f} MB; the limit is {limit_mb:g} MB.",
            param="file",
        )
    return await file.read()
