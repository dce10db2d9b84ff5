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

A request body larger than ``GATEWAY_MAX_REQUEST_MB`` (an upload route's: its own cap,
``uploads``) gets a 413 before the app reads it, a JSON body past ``GATEWAY_MAX_JSON_*`` a
400 before it is parsed, and a body refused before it was read is read to its end and
dropped first, so nginx sees no reset (:mod:`gateway.api.bodies`). A body over
:data:`CHECKED_BODY_BYTES` (or a chunked one) is read only for a valid key: FastAPI parses a
body before any dependency runs, so without this anyone could make a replica parse tens of
megabytes of JSON.

While the process drains before it stops (:class:`Drain`, started by SIGTERM), requests
already running go on to their end and every new one but the liveness probe and
``/metrics`` gets a 503 with ``Retry-After`` (the OpenAI SDKs retry it, and a load balancer
or Kubernetes, seeing ``/health/ready`` fail, sends the retry elsewhere).

A WebSocket (the Realtime API) is covered the same way: refused while draining, counted in
the metrics (status 101 once upgraded, else its refusal's) to its end, and its admission
(the connection's concurrency slot) settled when it closes. A refusal before the upgrade
is an HTTP response (the WebSocket denial response); under a server without that
extension, a close with code 1008 and the error's message. Open WebSockets do not hold
up the drain: a session lasts as long as its user talks, so the stop closes it.

With traces on (:mod:`gateway.tracing`), each ``/v1`` and ``/admin`` request and WebSocket
gets its server span here, continuing the ``traceparent`` it came with; with them off, the
only cost is one attribute read per request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import outages
from gateway.api.bodies import BodyGate, declared_length
from gateway.api.dependencies import services_of
from gateway.errors import (
    ANTHROPIC_PATHS,
    GatewayError,
    PayloadTooLargeError,
    anthropic_body,
    error_body,
    request_id,
)
from gateway.metrics import Metrics
from gateway.serving.batches.inprocess import BATCH_CALLER
from gateway.serving.json_shape import JsonLimits
from gateway.state.admission import Admission
from gateway.tracing import Activation, Tracing, failed, parent_of

#: Where the admission dependency leaves the request's admission (``request.state``).
ADMISSION = "admission"

LIVE_PATH = "/health/live"
_LIVE_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"15")],
}
_LIVE_BODY = {"type": "http.response.body", "body": b'{"status":"ok"}'}


#: What a request gets while the process drains (503, ``Retry-After: 1``).
DRAINING_ERROR = error_body(
    "The gateway is shutting down; retry shortly.", "server_error", code="shutting_down"
)
_DRAINING_BODY = json.dumps(DRAINING_ERROR).encode()


def _draining_start(body: bytes) -> Message:
    """The start of a draining process's 503 with ``body``."""
    return {
        "type": "http.response.start",
        "status": 503,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
        ],
    }


_DRAINING_START = _draining_start(_DRAINING_BODY)


class Drain:
    """The process's requests in flight, and whether it drains (takes no new ones)."""

    def __init__(self) -> None:
        self.draining = False
        self.busy = 0


#: Bodies larger than this are read only once the request's key is checked (1 MB: any
#: JSON request but one carrying audio is smaller).
CHECKED_BODY_BYTES = 1024 * 1024


class GatewayMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        drain: Drain,
        max_body_mb: float = 36.0,
        tracing: Tracing | None = None,
        backend_wait_s: float = 5.0,
        edge_body_mb: float = 36.0,
        json_limits: JsonLimits | None = None,
        inference_routes: frozenset[str] = frozenset(),
        uploads: Mapping[str, tuple[float, str]] | None = None,
    ) -> None:
        self.app = app
        self.inference_routes = inference_routes
        """The paths of the inference routes: their requests are labelled by path."""
        uploads = uploads or {}
        self.bodies = BodyGate(
            max_body_mb,
            edge_body_mb,
            json_limits or JsonLimits.defaults(),
            {path: mb for path, (mb, _) in uploads.items()},
        )
        # An upload route's 413 names its file and the setting of its limit, as nginx's.
        self._upload_too_large = {
            path: (
                f"The request body is larger than {max(mb, max_body_mb):g} MB: the file "
                f"exceeds the upload limit ({setting})."
            )
            for path, (mb, setting) in uploads.items()
        }
        self.backend_wait_s = backend_wait_s
        self.metrics = metrics
        self.drain = drain
        self.tracing = tracing
        """Set when traces are on (``gateway.tracing``): /v1 and /admin requests get a span."""
        self._too_large = (
            f"The request body is larger than {max_body_mb:g} MB, the most this gateway "
            "reads (GATEWAY_MAX_REQUEST_MB)."
        )

    def _too_large_error(self, path: str) -> PayloadTooLargeError:
        """The 413 of a body past its limit: an upload's names its file."""
        upload = self._upload_too_large.get(path)
        if upload is not None:
            return PayloadTooLargeError(upload, param="file", code="file_too_large")
        return PayloadTooLargeError(self._too_large, code="request_too_large")

    def _route_of(self, scope: Scope) -> str:
        return route_label(scope, self.inference_routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            if self.tracing is not None and self.tracing.tracer is not None:
                await self._traced(scope, receive, send, self._websocket_denied)
                return
            await self._websocket(scope, receive, _denials(scope, send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == LIVE_PATH and scope["method"] in ("GET", "HEAD"):
            await self._live(scope, send)
            return
        if (
            self.tracing is not None
            and self.tracing.tracer is not None
            and scope["path"].startswith(_TRACED_PATHS)
        ):
            await self._traced(scope, receive, send, self._http)
            return
        await self._http(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = declared_length(scope)
        if self.drain.draining and scope["path"] != "/metrics":
            await self._refuse(scope, receive, send, length)
            return
        refused = await self._unknown_caller(scope, length)
        if refused is not None:
            await self._send_error(scope, send, refused, await self.bodies.discard(receive, length))
            return
        bounded = await self.bodies.bounded(receive, length, self.bodies.limit(scope["path"]))
        if bounded is None:
            too_large = self._too_large_error(scope["path"])
            await self._send_error(
                scope, send, too_large, await self.bodies.discard(receive, length)
            )
            return
        shaped = await self.bodies.shaped(scope, bounded, length)
        if isinstance(shaped, GatewayError):
            await self._send_error(scope, send, shaped)
            return
        bounded = shaped
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

        in_flight = self.metrics.in_flight.labels(self._route_of(scope))
        in_flight.inc()
        self.drain.busy += 1
        # The request's allowance to wait for a backend coming back; a wait also ends when
        # the client goes away (no wait comes before the app has read the body).
        outages.begin(self.backend_wait_s, lambda: _disconnected(bounded))
        try:
            await self.app(scope, bounded, send_wrapped)
        finally:
            self.drain.busy -= 1
            in_flight.dec()
            # Settling may wait for a Redis coming back too, whoever is still listening.
            outages.begin(self.backend_wait_s)
            await self._settle(scope, status, started)

    async def _websocket_denied(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._websocket(scope, receive, _denials(scope, send))

    async def _traced(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        serve: Callable[[Scope, Receive, Send], Awaitable[None]],
    ) -> None:
        """``serve`` under the request's span, whose parent is the ``traceparent`` the
        client (or nginx) sent. It ends once the response's last byte is sent (a stream's
        included) and the admission settled, with the model, the key's id (never its
        secret), the tokens and the outcome; a request the sampler leaves out is served
        with nothing traced."""
        assert self.tracing is not None and self.tracing.tracer is not None
        tracer = self.tracing.tracer
        websocket = scope["type"] == "websocket"
        method = "WEBSOCKET" if websocket else scope["method"]
        request_span = tracer.start_span(
            f"{method} {self._route_of(scope)}",  # named by its route's template at the end
            context=parent_of(scope["headers"]),
            kind=SpanKind.SERVER,
            attributes=_request_attributes(scope, method),
        )
        if not request_span.is_recording():
            await serve(scope, receive, send)
            return
        status, completed, outcome = 500, False, ""

        async def send_traced(message: Message) -> None:
            nonlocal status, completed
            kind = message["type"]
            if kind == "http.response.start" or kind == "websocket.http.response.start":
                status = message["status"]
            elif kind == "http.response.body":
                completed = completed or not message.get("more_body", False)
            elif kind == "websocket.accept":
                status = 101
            elif kind == "websocket.close" and status != 101:
                status = 403
            await send(message)

        activation = Activation(tracer, request_span)
        try:
            await serve(scope, receive, send_traced)
        except (OSError, ClientDisconnect):
            outcome = "disconnected"
            raise
        except BaseException as exc:
            failed(request_span, exc)
            outcome = "failed"
            raise
        finally:
            activation.close()
            if not outcome:
                outcome = _outcome(status, completed or websocket)
            _end_request_span(request_span, scope, method, status, outcome)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.drain.draining:
            await self._refuse(scope, receive, send, None)
            return
        started = time.monotonic()
        scope.setdefault("state", {})
        status = 500

        async def send_wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "websocket.accept":
                status = 101
            elif message["type"] == "websocket.http.response.start":
                status = message["status"]
            elif message["type"] == "websocket.close" and status != 101:
                status = 403  # closed before the upgrade: the client sees a 403
            await send(message)

        in_flight = self.metrics.in_flight.labels(self._route_of(scope))
        in_flight.inc()
        try:
            await self.app(scope, receive, send_wrapped)
        finally:
            in_flight.dec()
            await self._settle(scope, status, started)

    async def _settle(self, scope: Scope, status: int, started: float) -> None:
        """Counts the request and settles its admission, if it was admitted."""
        admission: Admission | None = scope["state"].get(ADMISSION)
        if admission is not None and status == 404:
            # The model it named may not exist: no usage or metric series is kept under
            # that name (a key could mint names without end).
            admission.model = ""
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        if route != "/metrics":
            usage = admission.usage() if admission is not None else None
            self.metrics.record_request(route, usage, status, time.monotonic() - started)
        if admission is not None:
            gatekeeper = services_of(scope).gatekeeper
            # Shielded: a cancelled request still releases its slot and counts its usage.
            await asyncio.shield(gatekeeper.finish(admission))

    async def _live(self, scope: Scope, send: Send) -> None:
        started = time.monotonic()
        await send(_LIVE_START)
        await send(_LIVE_BODY if scope["method"] == "GET" else {"type": "http.response.body"})
        self.metrics.requests.labels(LIVE_PATH, "", "200").inc()
        self.metrics.duration.labels(LIVE_PATH, "").observe(time.monotonic() - started)

    async def _unknown_caller(self, scope: Scope, length: int | None) -> GatewayError | None:
        """The 401 (or 503) for a large body without a valid key; None to go on."""
        if length is None or 0 <= length <= CHECKED_BODY_BYTES or BATCH_CALLER in scope:
            return None  # (a batch's request: its key is admitted by gateway.api.auth)
        headers = Headers(scope=scope)
        scheme, _, presented = headers.get("authorization", "").partition(" ")
        bearer = presented.strip() if scheme.lower() == "bearer" else ""
        key = bearer or headers.get("x-api-key")  # as gateway.api.auth reads it
        gatekeeper = services_of(scope).gatekeeper
        try:
            await gatekeeper.check(key)
        except GatewayError as exc:
            return exc
        return None

    async def _send_error(
        self, scope: Scope, send: Send, error: GatewayError, body_read: bool = True
    ) -> None:
        """Sends ``error``; with ``body_read`` false (what is left of the body was not read)
        the connection is closed after it."""
        body = json.dumps(_shaped(scope, error.body(), error.status_code)).encode()
        headers = [(b"content-type", b"application/json")]
        if not body_read:
            headers.append((b"connection", b"close"))
        headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.metrics.requests.labels(self._route_of(scope), "", str(error.status_code)).inc()

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, length: int | None) -> None:
        """The 503 of a draining process, after the body was read and dropped."""
        await self.bodies.discard(receive, length)
        start, body = _DRAINING_START, _DRAINING_BODY
        if scope["path"].startswith(ANTHROPIC_PATHS):  # its own body, and so its length
            body = json.dumps(_shaped(scope, DRAINING_ERROR, 503)).encode()
            start = _draining_start(body)
        await send(start)
        await send({"type": "http.response.body", "body": body})
        self.metrics.requests.labels(self._route_of(scope), "", "503").inc()


#: The requests that get a span when traces are on (not the probes, /metrics or the
#: playground's files).
_TRACED_PATHS = ("/v1/", "/admin/")


def _request_attributes(scope: Scope, method: str) -> dict[str, str]:
    attributes = {"http.request.method": method, "url.path": scope["path"][:256]}
    for name, value in scope["headers"]:
        if name == b"x-request-id":  # nginx's id, which its access log has too
            attributes["gateway.request_id"] = value.decode("latin-1")[:128]
    return attributes


def _outcome(status: int, completed: bool) -> str:
    if not completed:
        return "disconnected"  # the client went away before the end of the body
    if status >= 500:
        return "error"
    return "refused" if status >= 400 else "ok"


def _end_request_span(span: Span, scope: Scope, method: str, status: int, outcome: str) -> None:
    route = getattr(scope.get("route"), "path", None)
    if route:
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if outcome != "failed":  # else failed() said what ended it
        span.set_attribute("gateway.outcome", outcome)
    admission: Admission | None = scope.get("state", {}).get(ADMISSION)
    if admission is not None:
        span.set_attribute("gateway.key.id", admission.key.id)
        if admission.model:
            span.set_attribute("gen_ai.request.model", admission.model)
        meter = admission.meter
        span.set_attribute("gen_ai.usage.input_tokens", meter.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", meter.completion_tokens)
        if meter.audio_seconds_in:
            span.set_attribute("gateway.audio.input_seconds", meter.audio_seconds_in)
        if meter.audio_seconds_out:
            span.set_attribute("gateway.audio.output_seconds", meter.audio_seconds_out)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))
    span.end()


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone away (read only after the body was)."""
    while (await receive())["type"] != "http.disconnect":
        pass


_GROUPS = frozenset({"v1", "admin", "health", "metrics"})


def route_label(scope: Scope, inference: frozenset[str]) -> str:
    """A bounded label for a request before routing: the inference routes (``inference``,
    marked where they are declared: :mod:`gateway.api.inference`) by name, the others by
    their group (``/v1``, ``/admin``, ``/health``, ``/metrics``), anything else ``other`` (a
    client must not be able to mint label values)."""
    path: str = scope.get("path", "")
    if path in inference:
        return path
    group = path.strip("/").split("/", 1)[0]
    return f"/{group}" if group in _GROUPS else "other"


#: Characters of an error's message a close frame carries (its reason: 123 bytes at most).
_CLOSE_REASON = 120


def _denials(scope: Scope, send: Send) -> Send:
    """``send`` for a WebSocket: an HTTP response before the upgrade (a refusal: the
    middleware's own, or an error handler's) goes out as the denial response; a server
    without that extension gets a close with code 1008 and the error's message instead."""
    denials = "websocket.http.response" in scope.get("extensions", {})

    async def sent(message: Message) -> None:
        kind = message["type"].removeprefix("websocket.")
        if not kind.startswith("http.response."):
            await send(message)
        elif denials:
            await send({**message, "type": f"websocket.{kind}"})
        elif kind == "http.response.body":
            await send({"type": "websocket.close", "code": 1008, "reason": _reason(message)})

    return sent


def _reason(message: Message) -> str:
    try:
        error = json.loads(message.get("body", b""))["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return "refused"
    return str(error)[:_CLOSE_REASON]


def _shaped(scope: Scope, body: dict[str, Any], status: int) -> dict[str, Any]:
    """An error body as the route's clients read it: Anthropic's on its routes."""
    if not scope["path"].startswith(ANTHROPIC_PATHS):
        return body
    return anthropic_body(body, status, request_id(Request(scope)))
