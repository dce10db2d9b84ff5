"""OpenTelemetry traces, off unless an OTLP endpoint is set (docs/tracing.md).

A traced request has one server span (``api/middleware.py``: model, key id, tokens,
outcome) with children: the admission in Redis (``api/auth.py``), each Triton request
(``backend/triton.py``) and, in a Realtime session, each response. The Triton request's
span goes to Triton as ``traceparent`` metadata of its gRPC call, so a Triton started with
OpenTelemetry tracing (``gateway up`` starts it so, :func:`triton_flags`) puts its own spans
(``InferRequest``, the model's) under it, in the same trace.

- :class:`Tracing` is one process's ``TracerProvider`` and OTLP/HTTP exporter, made in the
  app's lifespan (after any fork: the batch processor runs a thread) and flushed when it
  ends. It is never set as the global provider: FastAPI 0.165 turns its own spans, logs and
  metrics on as soon as one is (``create_app`` also turns them off explicitly).
- The request's tracer rides in a context variable (:data:`_TRACER`) set by the middleware
  for a sampled request only: everything below reads it (:func:`span`,
  :func:`client_span`), and with tracing off or the request not sampled it is None, so the
  request path does nothing more than read it.
- Sampling is the SDK's (``OTEL_TRACES_SAMPLER``, default ``parentbased_always_on``): a
  sampled ``traceparent`` from the client or nginx is always continued.

Only W3C trace context (``traceparent``, ``tracestate``) is read and sent: it is what
Triton reads. The key's secret never goes into a span (its public id does).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

#: Where OTLP/HTTP receivers take spans (appended to ``OTEL_EXPORTER_OTLP_ENDPOINT``).
TRACES_PATH = "/v1/traces"
#: ``service.name`` of the gateway's spans unless ``OTEL_SERVICE_NAME`` (or
#: ``OTEL_RESOURCE_ATTRIBUTES``) names another; Triton's own spans are ``triton``'s.
SERVICE_NAME = "triton-gateway"
TRITON_SERVICE_NAME = "triton"

_PROPAGATOR = TraceContextTextMapPropagator()
#: The tracer of the request being served, when it is traced and sampled.
_TRACER: ContextVar[Tracer | None] = ContextVar("gateway_tracer", default=None)
_CONTEXT_HEADERS = frozenset({b"traceparent", b"tracestate"})


def traces_endpoint(configured: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The OTLP/HTTP URL spans go to: ``GATEWAY_OTLP_TRACES_ENDPOINT`` (``configured``),
    else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` with
    ``/v1/traces``; None (tracing off) when none is set, or ``OTEL_SDK_DISABLED=true`` or
    ``OTEL_TRACES_EXPORTER=none`` say so."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    if configured:
        return configured
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + TRACES_PATH if base else None


def triton_flags(url: str, env: Mapping[str, str] = os.environ) -> list[str]:
    """``tritonserver`` options that make it join the gateway's traces: OpenTelemetry mode,
    only requests that arrive with a trace context (``rate=0``: it traces those whatever
    the rate), exported to ``url`` (Triton speaks OTLP/HTTP only; JSON). Its batch delay
    follows ``OTEL_BSP_SCHEDULE_DELAY`` when set, as the gateway's does."""
    flags = [
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=0",
        "--trace-config=count=-1",
        f"--trace-config=opentelemetry,url={url}",
        f"--trace-config=opentelemetry,resource=service.name={TRITON_SERVICE_NAME}",
    ]
    delay = env.get("OTEL_BSP_SCHEDULE_DELAY", "").strip()
    if delay.isdigit():
        flags.append(f"--trace-config=opentelemetry,bsp_schedule_delay={delay}")
    return flags


class Tracing:
    """This process's tracer provider and exporter (see the module docstring)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.tracer: Tracer | None = None
        """Set between :meth:`start` and :meth:`stop`."""
        self._provider: TracerProvider | None = None

    def start(self) -> None:
        """Makes the provider and its exporter (the SDK is imported only now: with tracing
        off it is never loaded). The exporter posts from the batch processor's own thread,
        so exporting never holds up the event loop."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({SERVICE_INSTANCE_ID: f"{socket.gethostname()}:{os.getpid()}"})
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
        provider = TracerProvider(resource=resource)  # sampler: OTEL_TRACES_SAMPLER
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=self.endpoint)))
        self._provider = provider
        self.tracer = provider.get_tracer("gateway")

    async def stop(self) -> None:
        """Sends what is left and stops the exporter (in a thread: it posts over HTTP)."""
        provider, self._provider, self.tracer = self._provider, None, None
        if provider is not None:
            await asyncio.to_thread(provider.shutdown)


def parent_of(headers: Iterable[tuple[bytes, bytes]]) -> otel_context.Context:
    """The trace context a request's ``traceparent`` / ``tracestate`` headers carry (an
    empty context without them, or with a malformed one)."""
    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in headers
        if name in _CONTEXT_HEADERS
    }
    if "tracestate" in carrier:
        carrier["tracestate"] = _bounded_tracestate(carrier["tracestate"])
    return _PROPAGATOR.extract(carrier) if carrier else otel_context.Context()


#: The most of a client's ``tracestate`` passed on (to the spans and Triton's call
#: metadata): what W3C Trace Context asks propagators to keep at least. A client's longer
#: one could fill gRPC's 8 KB of call headers and fail the call to Triton.
TRACESTATE_MAX = 512


def _bounded_tracestate(value: str) -> str:
    """The leading members of ``value`` (the most recent vendors') that fit
    :data:`TRACESTATE_MAX` characters, whole."""
    kept: list[str] = []
    size = 0
    for member in (m.strip() for m in value.split(",")):
        if not member:
            continue
        size += len(member) + (1 if kept else 0)
        if size > TRACESTATE_MAX:
            break
        kept.append(member)
    return ",".join(kept)


class Activation:
    """A request span made current for everything the request does (its children, and
    :data:`_TRACER` for the layers below), until :meth:`close`, in the same task."""

    __slots__ = ("_context", "_tracer")

    def __init__(self, tracer: Tracer, span: Span) -> None:
        self._context = otel_context.attach(trace.set_span_in_context(span))
        self._tracer: Token[Tracer | None] = _TRACER.set(tracer)

    def close(self) -> None:
        _TRACER.reset(self._tracer)
        otel_context.detach(self._context)


def current_tracer() -> Tracer | None:
    """The tracer of the request being served, if it is traced and sampled."""
    return _TRACER.get()


def failed(span: Span, exc: BaseException) -> None:
    """Marks ``span`` with what ended it: a gateway error by its code (an error status only
    for a 5xx: a refusal is the request's fault, not the server's), a cancellation as
    such, anything else as an error with the exception."""
    if isinstance(exc, asyncio.CancelledError):
        span.set_attribute("gateway.outcome", "cancelled")
    elif isinstance(exc, GatewayError):
        span.set_attribute("error.type", exc.code or type(exc).__name__)
        span.set_attribute("gateway.outcome", "error" if exc.status_code >= 500 else "refused")
        if exc.status_code >= 500:
            span.set_status(Status(StatusCode.ERROR, exc.message))
    else:
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_attribute("gateway.outcome", "error")
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))


@contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """A child span of the current request, current while the block runs (use it in a
    plain coroutine, never across an async generator's ``yield``); None when the request
    is not traced. An exception leaving the block marks it (:func:`failed`)."""
    tracer = _TRACER.get()
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            failed(current, exc)
            raise


def annotate(prefix: str, values: Mapping[str, str] | None) -> None:
    """Puts ``values`` on the request's span as ``<prefix>.<key>`` attributes (a client's
    telemetry ids, such as Responses ``client_metadata``); nothing when it is not traced."""
    current = trace.get_current_span()
    if not values or not current.is_recording():
        return
    for key, value in values.items():
        current.set_attribute(f"{prefix}.{key}", value)


def record(prefix: str, values: Mapping[str, float]) -> None:
    """Puts measurements on the request's span as ``<prefix>.<name>`` attributes (an
    engine's KV-cache hit rate, its queue time); nothing when it is not traced."""
    current = trace.get_current_span()
    if not current.is_recording():
        return
    for key, value in values.items():
        current.set_attribute(f"{prefix}.{key}", value)


def client_span(name: str) -> Span | None:
    """A client span under the current request, not made current (for an async generator,
    whose ``yield`` would leak it to its consumer); None when the request is not traced.
    The caller ends it."""
    tracer = _TRACER.get()
    if tracer is None:
        return None
    return tracer.start_span(name, kind=SpanKind.CLIENT)


def metadata(span: Span) -> tuple[tuple[str, str], ...]:
    """``span``'s context as gRPC metadata (``traceparent``, and ``tracestate`` if any),
    which Triton reads when a call opens."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return tuple(carrier.items())
