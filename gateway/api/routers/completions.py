"""POST /v1/completions (legacy: a raw prompt, no chat template)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway.api.auth import AdmissionDep
from gateway.api.dependencies import ServicesDep
from gateway.api.disconnect import cancel_on_disconnect
from gateway.api.inference import inference
from gateway.backend import scheduling
from gateway.serving.protocol import Completion, CompletionRequest
from gateway.serving.sse import SSE_HEADERS

router = APIRouter(prefix="/v1", tags=["completions"])


@router.post(
    "/completions",
    response_model=None,
    responses={200: {"model": Completion, "description": "A completion, or SSE chunks"}},
)
@inference
async def create_completion(
    body: CompletionRequest, services: ServicesDep, request: Request, admission: AdmissionDep
) -> Response:
    meter = admission.use_model(body.model)
    scheduling.start(admission.key.request_priority(body.priority))
    completions = services.completions
    prepared = await completions.prepare(body)
    if body.stream:
        events = await completions.stream(prepared, meter)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    completion = await cancel_on_disconnect(request, completions.complete(prepared, meter))
    return Response(completion.model_dump_json(), media_type="application/json")
