"""``POST /v1/realtime/client_secrets``: a client secret for one Realtime session (see
:mod:`gateway.serving.realtime_secrets`). Admitted like every ``/v1`` request, with an API
key: a client secret cannot create another."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from gateway.api.auth import AdmissionDep, PresentedKey
from gateway.api.dependencies import ServicesDep
from gateway.serving.realtime_secrets import ClientSecretCreated, ClientSecretRequest

router = APIRouter(prefix="/v1", tags=["realtime"])


@router.post(
    "/realtime/client_secrets",
    response_model=None,
    responses={200: {"model": ClientSecretCreated, "description": "The secret and its session"}},
)
async def create_client_secret(
    body: ClientSecretRequest,
    services: ServicesDep,
    admission: AdmissionDep,
    presented: PresentedKey,
) -> Response:
    created, admission.model = await services.realtime_secrets.create(
        admission.key, presented or "", body
    )
    return Response(created.model_dump_json(), media_type="application/json")
