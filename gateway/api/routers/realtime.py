"""``/v1/realtime``: the OpenAI Realtime API over a WebSocket (see
:mod:`gateway.serving.realtime` for the conversation itself).

The key comes as ``Authorization: Bearer <key>`` (the SDKs) or, from a browser, which
cannot set headers on a WebSocket, as the subprotocol ``openai-insecure-api-key.<key>``.
It is checked, and the session admitted under the key's limits (a request, and a
concurrency slot held while it is open), before the upgrade: a refused key or model (the
chat model, or the transcription or speech model the session would use) gets the OpenAI
error body with its HTTP status instead of a WebSocket.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from functools import partial
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketState

from gateway.api.dependencies import ServicesDep
from gateway.api.middleware import DRAINING_ERROR
from gateway.errors import GatewayError

router = APIRouter(tags=["realtime"])
logger = logging.getLogger("gateway.realtime")

ROUTE = "/v1/realtime"
_KEY_PROTOCOL = "openai-insecure-api-key."


def presented_key(websocket: WebSocket) -> str | None:
    authorization = websocket.headers.get("authorization", "")
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    protocols: list[str] = websocket.scope.get("subprotocols", [])
    for protocol in protocols:
        if protocol.startswith(_KEY_PROTOCOL):
            return protocol[len(_KEY_PROTOCOL) :]
    return None


async def _deny(websocket: WebSocket, status: int, body: dict[str, Any], headers: Any) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(
            JSONResponse(body, status_code=status, headers=headers)
        )
    else:  # a server without denial responses: a close before the upgrade is a 403
        await websocket.close(code=1008, reason=body["error"]["message"][:120])


@router.websocket(ROUTE)
async def realtime(websocket: WebSocket, services: ServicesDep, model: str | None = None) -> None:
    """A Realtime session (``client.realtime.connect(model=...)``)."""
    metrics = services.metrics
    if websocket.app.state.drain.draining:
        await _deny(websocket, 503, DRAINING_ERROR, {"Retry-After": "1"})
        metrics.requests.labels(ROUTE, "", "503").inc()
        return
    gatekeeper = services.gatekeeper
    key = presented_key(websocket)
    lock = asyncio.Lock()
    open_ = True

    async def send(event: dict[str, Any]) -> None:
        nonlocal open_
        if not open_:
            return
        async with lock:
            try:
                await websocket.send_text(json.dumps(event))
            except Exception:  # the client is gone; the receive loop ends the session
                open_ = False

    admission = None
    try:
        admission = await gatekeeper.admit(key)
        admit = partial(gatekeeper.admit, key, hold_lease=False)
        session = await services.realtime.open(model, admission.key, admit, send)
    except GatewayError as exc:
        if admission is not None:  # admitted, then refused: its slot is given back
            await gatekeeper.finish(admission)
        await _deny(websocket, exc.status_code, exc.body(), exc.headers)
        metrics.requests.labels(ROUTE, model or "", str(exc.status_code)).inc()
        return
    admission.model = session.config.model
    offered = websocket.scope.get("subprotocols", [])
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
    metrics.realtime_sessions.inc()
    started = time.monotonic()
    try:
        await session.start()
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            data = message.get("text")
            await session.handle(data if data is not None else message.get("bytes") or b"")
    finally:
        open_ = False
        await session.close()
        await asyncio.shield(gatekeeper.finish(admission))
        metrics.realtime_sessions.dec()
        metrics.record_request(ROUTE, admission, 101, time.monotonic() - started)
        if websocket.client_state == WebSocketState.CONNECTED:
            await websocket.close()
