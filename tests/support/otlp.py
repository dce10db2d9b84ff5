"""An OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` in a thread, keeping every span
it is sent. It takes both encodings: protobuf (the Python SDK's ``OTLPSpanExporter``) and
JSON (Triton's exporter, opentelemetry-cpp: ids in hex)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    attributes: dict[str, Any] = field(hash=False)
    status: str = ""
    events: tuple[str, ...] = ()


def _value(value: dict[str, Any]) -> Any:
    for kind in ("stringValue", "boolValue", "doubleValue"):
        if kind in value:
            return value[kind]
    if "intValue" in value:
        return int(value["intValue"])
    if "arrayValue" in value:
        return [_value(v) for v in value["arrayValue"].get("values", [])]
    return None


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value", {})) for a in items}


def _hex(value: str, from_base64: bool) -> str:
    """An id as hex: JSON OTLP writes hex; protobuf turned into a dict writes base64."""
    return base64.b64decode(value).hex() if from_base64 and value else value.lower()


def spans_of(export: dict[str, Any], from_base64: bool) -> list[ReceivedSpan]:
    """The spans of one ``ExportTraceServiceRequest`` in its JSON shape."""
    found = []
    for resource_spans in export.get("resourceSpans", []):
        resource = _attributes(resource_spans.get("resource", {}).get("attributes", []))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                kind = span.get("kind", "")
                found.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=span["name"],
                        trace_id=_hex(span.get("traceId", ""), from_base64),
                        span_id=_hex(span.get("spanId", ""), from_base64),
                        parent_id=_hex(span.get("parentSpanId", ""), from_base64),
                        kind=str(kind),
                        attributes=_attributes(span.get("attributes", [])),
                        status=str(span.get("status", {}).get("code", "")),
                        events=tuple(e.get("name", "") for e in span.get("events", [])),
                    )
                )
    return found


class OtlpReceiver:
    """The receiver on a free loopback port; :attr:`url` is its full traces URL."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.content_types: set[str] = set()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                if kind == "application/json":
                    spans = spans_of(json.loads(body), from_base64=False)
                else:
                    message = ExportTraceServiceRequest.FromString(body)
                    spans = spans_of(MessageToDict(message), from_base64=True)
                with receiver._lock:
                    receiver.content_types.add(kind)
                    receiver.spans.extend(spans)
                self.send_response(200)
                self.send_header("Content-Type", kind or "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 15.0
    ) -> list[ReceivedSpan]:
        """The spans received once ``found`` holds of them (an AssertionError after
        ``timeout_s``: exporters send in batches, every few hundred milliseconds here)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.received()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in spans})
                raise AssertionError(f"the spans expected never came; received: {names}")
            time.sleep(0.05)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()
