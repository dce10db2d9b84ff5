"""OpenTelemetry traces (``gateway/tracing.py``): the request's span and its admission child
as an OTLP receiver gets them from the app's own exporter, the client's ``traceparent``
continued, the outcome of a stream the client left, off without an endpoint. The Triton
span and Triton's own spans are proven on the real stack (tests/integration/test_tracing_e2e.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.backend.fake import FakeBackend
from gateway.tracing import traces_endpoint, triton_flags
from tests.support.asgi import StreamingASGITransport
from tests.support.bodies import chat_body
from tests.support.inprocess import AUTH, BASE_URL, bearer, make_settings, new_key, serve
from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.realtime import VOICE_MODELS, events_until, say_hi

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER"):
        monkeypatch.delenv(name, raising=False)
    with otlp_receiver() as started:
        yield started


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


async def test_a_request_span_names_model_key_tokens_and_outcome_with_its_admission(
    receiver: OtlpReceiver,
) -> None:
    settings = make_settings(otlp_traces_endpoint=receiver.url)
    async with serve(settings) as (_, http, _sdk):
        created = await new_key(http, models=["fake-chat"])
        answered = await http.post(
            "/v1/chat/completions",
            json=chat_body(),
            headers={**bearer(created["key"]), "X-Request-ID": "req-42"},
        )
        assert answered.status_code == 200
    # The lifespan's end flushed the exporter: everything is here.
    spans = receiver.received()
    assert receiver.content_types == {"application/x-protobuf"}
    request = _one(spans, "POST /v1/chat/completions")
    assert request.service == "triton-gateway"
    assert request.kind == "SPAN_KIND_SERVER"
    assert request.parent_id == ""  # no traceparent came: a new trace
    usage = answered.json()["usage"]
    assert request.attributes == {
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions",
        "gateway.request_id": "req-42",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "gateway.outcome": "ok",
        "gateway.key.id": created["id"],
        "gen_ai.request.model": "fake-chat",
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
    }
    admission = _one([s for s in spans if s.trace_id == request.trace_id], "redis.admission")
    assert admission.parent_id == request.span_id
    assert admission.attributes["gateway.key.id"] == created["id"]
    assert admission.attributes["gateway.outcome"] == "admitted"
    # The admin call that made the key was traced too; no span anywhere holds a secret.
    assert {s.attributes.get("http.route") for s in spans} >= {"/admin/keys"}
    for span in spans:
        for value in span.attributes.values():
            assert created["key"] not in str(value)
            assert settings.admin_key is not None
            assert settings.admin_key.get_secret_value() not in str(value)


async def test_the_clients_traceparent_is_continued_and_an_unsampled_one_traces_nothing(
    receiver: OtlpReceiver,
) -> None:
    async with serve(make_settings(otlp_traces_endpoint=receiver.url)) as (_, http, _sdk):
        sampled = f"00-{TRACE_ID}-{PARENT_ID}-01"
        assert (await http.get("/v1/models", headers={"traceparent": sampled})).status_code == 200
        unsampled = f"00-{'1' * 32}-{PARENT_ID}-00"
        assert (await http.get("/v1/models", headers={"traceparent": unsampled})).status_code == 200
    spans = receiver.received()
    request = _one(spans, "GET /v1/models")
    assert (request.trace_id, request.parent_id) == (TRACE_ID, PARENT_ID)
    assert {s.trace_id for s in spans} == {TRACE_ID}  # nothing of the unsampled request


async def test_a_refused_key_is_a_refusal_on_both_spans_and_its_text_is_in_none(
    receiver: OtlpReceiver,
) -> None:
    wrong = "sk-gw-0123456789ab-notthesecretatall"
    async with serve(make_settings(otlp_traces_endpoint=receiver.url)) as (_, http, _sdk):
        refused = await http.post("/v1/chat/completions", json=chat_body(), headers=bearer(wrong))
        assert refused.status_code == 401
    spans = receiver.received()
    request = _one(spans, "POST /v1/chat/completions")
    assert request.attributes["gateway.outcome"] == "refused"
    assert request.attributes["http.response.status_code"] == 401
    assert "gateway.key.id" not in request.attributes  # never admitted
    admission = _one(spans, "redis.admission")
    assert admission.parent_id == request.span_id
    assert admission.attributes["gateway.outcome"] == "refused"
    assert admission.attributes["error.type"] == "invalid_api_key"
    assert admission.status != "STATUS_CODE_ERROR"  # the caller's fault, not the server's
    assert not any(wrong in str(v) for s in spans for v in s.attributes.values())


async def test_a_stream_the_client_left_ends_its_span_as_disconnected(
    receiver: OtlpReceiver,
) -> None:
    async with serve(make_settings(otlp_traces_endpoint=receiver.url)) as (app, _, _sdk):
        fake = app.state.services.backend
        fake.reply = " ".join(f"w{i}" for i in range(200))
        fake.token_delay_s = 0.01
        transport = StreamingASGITransport(app)
        async with (
            httpx.AsyncClient(
                transport=transport, base_url=BASE_URL, headers=bearer(make_settings_key())
            ) as stream_http,
            stream_http.stream(
                "POST", "/v1/chat/completions", json=chat_body(stream=True)
            ) as response,
        ):
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if '"content":"w' in line:
                    break  # leaving closes the response: the client went away
        assert fake.calls[-1].cancelled is True
    request = _one(receiver.received(), "POST /v1/chat/completions")
    assert request.attributes["gateway.outcome"] == "disconnected"
    assert request.attributes["http.response.status_code"] == 200
    assert 0 < request.attributes["gen_ai.usage.output_tokens"] < 200


def make_settings_key() -> str:
    settings = make_settings()
    assert settings.admin_key is not None
    return settings.admin_key.get_secret_value()


async def test_the_standard_otel_endpoint_turns_traces_on_and_otel_sdk_disabled_off(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.removesuffix("/v1/traces"))
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    async with serve(make_settings()) as (_, http, _sdk):
        assert (await http.get("/v1/models")).status_code == 200
    assert receiver.received() == []
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    async with serve(make_settings()) as (_, http, _sdk):
        assert (await http.get("/v1/models")).status_code == 200
        assert (await http.get("/health/ready")).status_code == 200  # probes: no span
    assert sorted(s.name for s in receiver.received()) == ["GET /v1/models", "redis.admission"]


def test_the_endpoint_is_the_setting_else_the_standard_variables() -> None:
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    assert traces_endpoint(None, {}) is None
    assert traces_endpoint(None, base) == "http://collector:4318/v1/traces"
    both = {**base, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/x"}
    assert traces_endpoint(None, both) == "http://traces:4318/x"
    assert traces_endpoint("http://mine:4318/v1/traces", both) == "http://mine:4318/v1/traces"
    assert traces_endpoint("http://mine:4318/v1/traces", {"OTEL_SDK_DISABLED": "TRUE"}) is None
    assert traces_endpoint(None, {**base, "OTEL_TRACES_EXPORTER": "none"}) is None


def test_triton_joins_traces_only_when_asked_by_a_propagated_context() -> None:
    flags = triton_flags("http://c:4318/v1/traces", {"OTEL_BSP_SCHEDULE_DELAY": "200"})
    assert flags == [
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=0",
        "--trace-config=count=-1",
        "--trace-config=opentelemetry,url=http://c:4318/v1/traces",
        "--trace-config=opentelemetry,resource=service.name=triton",
        "--trace-config=opentelemetry,bsp_schedule_delay=200",
    ]
    assert "--trace-config=opentelemetry,bsp_schedule_delay=200" not in triton_flags("u", {})


def test_the_setting_takes_only_an_http_url() -> None:
    with pytest.raises(ValueError, match="otlp_traces_endpoint"):
        make_settings(otlp_traces_endpoint="collector:4317")


def test_a_realtime_session_has_its_span_and_one_per_response(receiver: OtlpReceiver) -> None:
    settings = make_settings(models=VOICE_MODELS, otlp_traces_endpoint=receiver.url)
    with (
        TestClient(create_app(settings, backend=FakeBackend())) as client,
        client.websocket_connect("/v1/realtime?model=fake-chat", headers=AUTH) as socket,
    ):
        events_until(socket, "session.created")
        # The Agents SDK's trace settings name the session's span.
        tracing = {"workflow_name": "Voice agent", "group_id": "call-7", "metadata": {"a": 1}}
        socket.send_json({"type": "session.update", "session": {"tracing": tracing}})
        events_until(socket, "session.updated")
        say_hi(socket)
        events_until(socket, "conversation.item.done")
        socket.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        done = events_until(socket, "response.done")[-1]["response"]
        # The client closes; Starlette's test client cancels the app at once after (no
        # server does): the session first sees the close, as it would over a network.
        socket.close(1000)
        time.sleep(0.3)
    spans = receiver.received()
    session = _one(spans, "WEBSOCKET /v1/realtime")
    assert session.attributes["http.response.status_code"] == 101
    assert session.attributes["gateway.outcome"] == "ok"
    named = {k: v for k, v in session.attributes.items() if k.startswith("gateway.realtime.")}
    assert named == {
        "gateway.realtime.tracing.mode": "named",
        "gateway.realtime.tracing.workflow_name": "Voice agent",
        "gateway.realtime.tracing.group_id": "call-7",
        "gateway.realtime.tracing.metadata.a": "1",
    }
    response = _one(spans, "realtime.response")
    assert response.parent_id == session.span_id
    assert response.attributes == {
        "gen_ai.request.model": "fake-chat",
        "gateway.realtime.status": "completed",
        "gateway.outcome": "ok",
        "gen_ai.usage.input_tokens": done["usage"]["input_tokens"],
        "gen_ai.usage.output_tokens": done["usage"]["output_tokens"],
    }
    assert _one(spans, "redis.admission").parent_id == session.span_id


def test_a_clients_tracestate_reaches_triton_whole_members_and_at_most_512_characters() -> None:
    """What Triton's call metadata carries of a client's ``tracestate``: its leading whole
    members, 512 characters at most (gRPC refuses calls with more than 8 KB of headers)."""
    from opentelemetry.sdk.trace import TracerProvider

    from gateway.tracing import metadata, parent_of

    sent = ",".join(f"v{i}=" + "x" * 200 for i in range(32))  # 6.6 KB, 32 members
    parent = f"00-{TRACE_ID}-{PARENT_ID}-01".encode()
    context = parent_of([(b"traceparent", parent), (b"tracestate", sent.encode())])
    span = TracerProvider().get_tracer("test").start_span("triton.infer", context=context)
    carried = dict(metadata(span))
    assert carried["traceparent"].split("-")[1] == TRACE_ID
    assert carried["tracestate"] == ",".join(sent.split(",")[:2])  # 2 x 203 + 1 characters
    small = "vendor=abc,other=def"
    context = parent_of([(b"traceparent", parent), (b"tracestate", small.encode())])
    span = TracerProvider().get_tracer("test").start_span("triton.infer", context=context)
    assert dict(metadata(span))["tracestate"] == small
