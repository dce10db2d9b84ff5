"""``POST /v1/realtime/client_secrets``: a client secret for one Realtime session (see
:mod:`gateway.serving.realtime_secrets`). Admitted like every ``/v1`` request, with an API
key: a client secret cannot create another."""

from __future__ import annotations

from typing import Any

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
    created = await services.realtime_secrets.create(admission.key, presented or "", body)
    # (A transcription session has no chat model: its transcription model names it.)
    session = created.session
    admission.model = str(
        session.get("model") or session["audio"]["input"]["transcription"]["model"]
    )
    return Response(created.model_dump_json(), media_type="application/json")


def _model_of(session: dict[str, Any]) -> str | None:
    """The model a secret's session uses: its chat model, or a transcription session's
    transcription model."""
    if session.get("model"):
        return str(session["model"])
    transcription = session.get("audio", {}).get("input", {}).get("transcription") or {}
    return transcription.get("model")
