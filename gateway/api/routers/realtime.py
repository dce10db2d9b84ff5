"""``/v1/realtime``: the OpenAI Realtime API over a WebSocket (see
:mod:`gateway.serving.realtime` for the conversation itself).

The connection is admitted like every ``/v1`` request (:func:`gateway.api.auth.admit`: the
key from ``Authorization: Bearer <key>``, or from a browser, which cannot set headers on a
WebSocket, the subprotocol ``openai-insecure-api-key.<key>``), and holds its concurrency
slot while it is open; the middleware settles it when it closes. A refused key, or a
model the key may not use (the chat model, or the transcription or speech model the
session would use), gets the OpenAI error body with its HTTP status instead of the
upgrade. A Realtime client secret (``ek_...``, :mod:`gateway.api.routers.realtime_secrets`)
stands for the key that created it and opens the session configured as it says.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketState

from gateway.api.auth import AdmissionDep, ClientSecretDep, PresentedKey, ReadmitDep
from gateway.api.dependencies import ServicesDep
from gateway.api.inference import inference
from gateway.errors import InvalidRequestError
from gateway.serving.realtime import RealtimeSession

router = APIRouter(tags=["realtime"])


@router.websocket("/v1/realtime")
@inference
async def realtime(
    websocket: WebSocket,
    admission: AdmissionDep,
    readmit: ReadmitDep,
    services: ServicesDep,
    secret: ClientSecretDep,
    presented: PresentedKey,
    model: str | None = None,
    intent: str | None = None,
) -> None:
    """A Realtime session (``client.realtime.connect(model=...)``), or a transcription
    session (``?intent=transcription``)."""
    offered = websocket.scope.get("subprotocols", [])
    _refuse_beta(websocket, offered)
    if intent not in (None, "transcription"):
        raise InvalidRequestError(
            f"Unknown intent '{intent}': leave it out for a conversation, or use "
            "'transcription' for a transcription session.",
            param="intent",
        )
    connection = _Connection(websocket)
    spec = None
    if secret is not None:  # opened with a client secret: the session it was created for
        model, spec = await services.realtime_secrets.session_of(secret, model)
    session = await services.realtime.open(
        model, admission.key, readmit, connection.send, session=spec, intent=intent
    )
    if secret is not None:  # every check passed: the secret is used up (one session)
        await services.realtime_secrets.store.consume(presented or "")
    admission.model = session.config.usage_model
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
    await connection.serve(session)


#: What a client of the beta Realtime interface sends (openai-python before its GA
#: ``client.realtime``, and older browser code): its events have other names and shapes.
_BETA_PROTOCOL = "openai-beta.realtime-v1"


def _refuse_beta(websocket: WebSocket, offered: list[str]) -> None:
    """A client of the beta interface is refused before the upgrade, rather than given a
    session whose events (and audio) it cannot read."""
    beta = websocket.headers.get("openai-beta", "")
    if _BETA_PROTOCOL in offered or "realtime=v1" in beta.replace(" ", ""):
        raise InvalidRequestError(
            "This gateway serves the GA Realtime interface only; the beta interface "
            "('OpenAI-Beta: realtime=v1', the 'openai-beta.realtime-v1' subprotocol) is "
            "not served. Drop that header or subprotocol and use the GA event names "
            "(openai-python's client.realtime, openai-node's OpenAIRealtimeWebSocket).",
            param="OpenAI-Beta",
            code="unsupported_interface",
        )


class _Connection:
    """Hands the client's messages to the session, one at a time, and its events to the
    client (whichever task sends them)."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self._lock = asyncio.Lock()
        self._open = True

    async def send(self, event: dict[str, Any]) -> None:
        if not self._open:
            return
        async with self._lock:
            try:
                await self.websocket.send_text(json.dumps(event))
            except Exception:  # the client is gone; the receive loop ends the session
                self._open = False

    async def serve(self, session: RealtimeSession) -> None:
        websocket = self.websocket
        try:
            await session.start()
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("text")
                await session.handle(data if data is not None else message.get("bytes") or b"")
        finally:
            self._open = False
            await session.close()
            if websocket.client_state == WebSocketState.CONNECTED:
                await websocket.close()
