"""The gateway's one pure ASGI middleware (no ``BaseHTTPMiddleware``: it wraps ``send`` and
leaves streamed bodies untouched). One layer, not one per concern: its ``send`` wrapper runs
for every streamed chunk.

It counts every request (route template, model, final status), its duration to the last
byte, the requests in flight and what an admitted request used; adds an admitted request's
rate-limit headers to its response; and settles its admission (lease, tokens, usage) after
the last byte of the body, or when the client went away.

It also answers the liveness probe (``GET /health/live``) itself: a probe only asks whether
the process serves HTTP, and orchestrators send many; routing it through FastAPI cost three
times what uvicorn itself spends on a request (``tests/bench/cpu.py``). The route stays
declared in the app, so it is documented in the OpenAPI schema like the others.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.metrics import Metrics
from gateway.state.limits import Admission, RateLimiter

#: Where the admission dependency leaves the request's admission (``request.state``).
ADMISSION = "admission"

LIVE_PATH = "/health/live"
_LIVE_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"15")],
}
_LIVE_BODY = {"type": "http.response.body", "body": b'{"status":"ok"}'}


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == LIVE_PATH and scope["method"] in ("GET", "HEAD"):
            await self._live(scope, send)
            return
        started = time.monotonic()
        # request.state is this dict (Starlette keeps it in the scope).
        state: dict[str, Any] = scope.setdefault("state", {})
        status = 500

        async def send_wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                admission: Admission | None = state.get(ADMISSION)
                if admission is not None and admission.headers:
                    headers = MutableHeaders(scope=message)
                    for name, value in admission.headers.items():
                        headers[name] = value
            await send(message)

        in_flight = self.metrics.in_flight.labels(_route_of(scope))
        in_flight.inc()
        try:
            await self.app(scope, receive, send_wrapped)
        finally:
            in_flight.dec()
            admission = state.get(ADMISSION)
            if admission is not None:
                limiter: RateLimiter = scope["app"].state.limiter
                # Shielded: a cancelled request still releases its slot and counts its usage.
                await asyncio.shield(limiter.finish(admission))
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            if route != "/metrics":
                self._record(route, admission, status, time.monotonic() - started)

    async def _live(self, scope: Scope, send: Send) -> None:
        started = time.monotonic()
        await send(_LIVE_START)
        await send(_LIVE_BODY if scope["method"] == "GET" else {"type": "http.response.body"})
        self.metrics.requests.labels(LIVE_PATH, "", "200").inc()
        self.metrics.duration.labels(LIVE_PATH, "").observe(time.monotonic() - started)

    def _record(self, route: str, admission: Admission | None, status: int, elapsed: float) -> None:
        model = admission.model if admission is not None else ""
        self.metrics.requests.labels(route, model, str(status)).inc()
        self.metrics.duration.labels(route, model).observe(elapsed)
        if admission is None or not model:
            return
        meter = admission.meter
        if meter.prompt_tokens:
            self.metrics.prompt_tokens.labels(model).inc(meter.prompt_tokens)
        if meter.completion_tokens:
            self.metrics.completion_tokens.labels(model).inc(meter.completion_tokens)
        if meter.audio_seconds_in:
            self.metrics.audio_in.labels(model).inc(meter.audio_seconds_in)
        if meter.audio_seconds_out:
            self.metrics.audio_out.labels(model).inc(meter.audio_seconds_out)


_INFERENCE_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/audio/speech",
        "/v1/audio/transcriptions",
    }
)
_GROUPS = frozenset({"v1", "admin", "health", "metrics"})


def _route_of(scope: Scope) -> str:
    """A bounded label for a request before routing: the inference routes by name, the
    others by their group (``/v1``, ``/admin``, ``/health``, ``/metrics``), anything else
    ``other`` (a client must not be able to mint label values)."""
    path: str = scope.get("path", "")
    if path in _INFERENCE_ROUTES:
        return path
    group = path.strip("/").split("/", 1)[0]
    return f"/{group}" if group in _GROUPS else "other"
