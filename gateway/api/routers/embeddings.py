"""POST /v1/embeddings."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.auth import AdmissionDep
from gateway.api.dependencies import ServicesDep
from gateway.api.disconnect import cancel_on_disconnect
from gateway.api.inference import inference
from gateway.backend import scheduling
from gateway.serving.protocol import EmbeddingList, EmbeddingRequest

router = APIRouter(prefix="/v1", tags=["embeddings"])


@router.post(
    "/embeddings",
    response_model=None,
    responses={200: {"model": EmbeddingList, "description": "One vector per input"}},
)
@inference
async def create_embeddings(
    body: EmbeddingRequest, services: ServicesDep, request: Request, admission: AdmissionDep
) -> Response:
    meter = admission.use_model(body.model)
    scheduling.start(admission.key.request_priority(body.priority))
    result = await cancel_on_disconnect(request, services.embeddings.embed(body, meter))
    return Response(result.model_dump_json(), media_type="application/json")
