"""Traces on the real stack: nginx, two gateway replicas and Triton started by ``gateway up``
with an OTLP endpoint (the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and an OTLP
receiver in the test. One trace holds the gateway's request span, its admission and Triton
call children, and Triton's own spans under the gateway's Triton call; a client's
``traceparent`` (through nginx) is continued; the key's secret is in no span."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[GatewayProcess, OtlpReceiver]]:
    with otlp_receiver() as receiver:
        gateway = GatewayProcess(
            models=["mock_chat"],
            env={
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
                # Batches every 200 ms (gateway and Triton) instead of 5 s.
                "OTEL_BSP_SCHEDULE_DELAY": "200",
            },
        )
        with gateway.running(180):
            yield gateway, receiver


def _trace(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == trace_id]


def _complete(trace_id: str) -> Callable[[list[ReceivedSpan]], bool]:
    """Whether the trace has all its spans: the gateway's request and Triton call, Triton's
    request and model spans (each side exports in batches of its own, in any order)."""

    def found(spans: list[ReceivedSpan]) -> bool:
        names = {(s.service, s.name) for s in _trace(spans, trace_id)}
        return {
            ("triton-gateway", "POST /v1/chat/completions"),
            ("triton-gateway", "triton.infer"),
            ("triton", "InferRequest"),
            ("triton", "mock_chat"),
        } <= names

    return found


def _one(spans: list[ReceivedSpan], service: str, name: str) -> ReceivedSpan:
    found = [s for s in spans if (s.service, s.name) == (service, name)]
    assert len(found) == 1, sorted((s.service, s.name) for s in spans)
    return found[0]


def test_one_trace_holds_the_gateway_and_triton_under_the_clients_traceparent(
    traced: tuple[GatewayProcess, OtlpReceiver],
) -> None:
    gateway, receiver = traced
    created = gateway.create_key("traced", models=["mock_chat"])
    secret = created["key"]
    stream = gateway.client(secret).chat.completions.create(
        model="mock_chat",
        messages=[{"role": "user", "content": "[mock:words=5] hello"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"},
    )
    chunks = list(stream)  # to its end: the request's span ends with the stream
    usage = next(chunk.usage for chunk in chunks if chunk.usage is not None)

    spans = _trace(receiver.wait_for(_complete(TRACE_ID)), TRACE_ID)
    request = _one(spans, "triton-gateway", "POST /v1/chat/completions")
    # nginx passed the client's traceparent through; the gateway continued it.
    assert request.parent_id == CLIENT_SPAN
    assert request.kind == "SPAN_KIND_SERVER"
    assert request.attributes["gateway.key.id"] == created["id"]
    assert request.attributes["gen_ai.request.model"] == "mock_chat"
    assert request.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens == 5
    assert request.attributes["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert request.attributes["gateway.outcome"] == "ok"
    assert request.attributes["gateway.request_id"]  # nginx's id, as in its access log
    admission = _one(spans, "triton-gateway", "redis.admission")
    call = _one(spans, "triton-gateway", "triton.infer")
    assert admission.parent_id == call.parent_id == request.span_id
    assert call.attributes["triton.model_name"] == "mock_chat"
    assert call.attributes["rpc.method"] == "ModelStreamInfer"
    assert call.attributes["gateway.outcome"] == "ok"
    assert call.events == ("first_response",)
    # Triton's own spans, from its own exporter (OTLP/JSON), joined the trace: its request
    # under the gateway's Triton call, the model's span under its request.
    infer = _one(spans, "triton", "InferRequest")
    model = _one(spans, "triton", "mock_chat")
    assert infer.parent_id == call.span_id
    assert model.parent_id == infer.span_id
    assert model.attributes["triton.model_name"] == "mock_chat"
    assert receiver.content_types == {"application/json", "application/x-protobuf"}
    for span in receiver.received():
        assert not any(secret in str(value) for value in span.attributes.values()), span


def test_a_new_trace_without_traceparent_and_none_in_triton_for_an_unsampled_one(
    traced: tuple[GatewayProcess, OtlpReceiver],
) -> None:
    gateway, receiver = traced
    client = gateway.client()
    before = {s.trace_id for s in receiver.received()}
    client.chat.completions.create(
        model="mock_chat", messages=[{"role": "user", "content": "[mock:words=3] hi"}]
    )

    def complete_new_traces(spans: list[ReceivedSpan]) -> list[str]:
        # (Any new trace whose spans have all come: a span of another, earlier request
        # that arrives late must not be taken for this request's.)
        new = {s.trace_id for s in spans} - before
        return [trace for trace in sorted(new) if _complete(trace)(spans)]

    try:
        spans = receiver.wait_for(lambda spans: bool(complete_new_traces(spans)))
    except AssertionError:
        new = {s.trace_id for s in receiver.received()} - before
        got = {t: sorted((s.service, s.name) for s in _trace(receiver.received(), t)) for t in new}
        raise AssertionError(f"no new trace is complete; the new traces hold: {got}") from None
    trace_id = complete_new_traces(spans)[0]
    spans = _trace(spans, trace_id)
    request = _one(spans, "triton-gateway", "POST /v1/chat/completions")
    assert request.parent_id == ""  # the gateway started the trace
    call = _one(spans, "triton-gateway", "triton.infer")
    assert _one(spans, "triton", "InferRequest").parent_id == call.span_id

    # A client's unsampled context: the gateway traces nothing, and Triton, which traces
    # only requests that bring a context, gets none, on the kept calls included.
    count = len(receiver.received())
    unsampled = f"00-{'e' * 32}-{CLIENT_SPAN}-00"
    for _ in range(4):
        answered = httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json={"model": "mock_chat", "messages": [{"role": "user", "content": "hi"}]},
            headers={**gateway.headers, "traceparent": unsampled},
            timeout=30,
        )
        assert answered.status_code == 200
    time.sleep(1.0)  # five of Triton's batch delays: what it traced has come by now
    assert [s.name for s in receiver.received()[count:]] == []
