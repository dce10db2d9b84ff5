"""/metrics: what operators and the Grafana dashboard read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from gateway.backend.fake import FakeBackend
from tests.monitoring import ELSEWHERE
from tests.unit.conftest import bearer, chat_body, make_settings, new_key, serve
from tests.unit.test_transcription import tone_file

DASHBOARD = Path(__file__).resolve().parents[2] / "compose/grafana/dashboards/gateway.json"


def dashboard_metrics() -> set[str]:
    """Every gateway_* series the Grafana dashboard queries (suffixes of histograms kept)."""
    exprs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(DASHBOARD.read_text()))
    return {name for expr in exprs for name in re.findall(r"\bgateway_[a-z_]+", expr)}


def series(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


async def test_every_dashboard_metric_but_triton_errors_is_exported_after_traffic(
    http: httpx.AsyncClient,
) -> None:
    # Triton errors come from the real Triton adapter: the integration test covers them.
    limited = (await new_key(http, rpm=2, budget={"tokens_per_day": 10**6}))["key"]
    for _ in range(3):  # a stream, a transcription, then a 429
        await http.post(
            "/v1/chat/completions", json=chat_body(stream=True), headers=bearer(limited)
        )
    await http.post("/v1/audio/speech", json={"model": "fake-tts", "voice": "alloy", "input": "A."})
    await http.post(
        "/v1/audio/transcriptions",
        data={"model": "fake-stt"},
        files={"file": ("a.wav", tone_file(1))},
    )
    wanted = dashboard_metrics()
    assert len(wanted) >= 10
    missing = wanted - series((await http.get("/metrics")).text)
    # And what needs settings these tests do not set (tests/integration/test_monitoring_e2e.py
    # exports them): money spent needs GATEWAY_PRICES, the queue GATEWAY_TRITON_MAX_INFLIGHT.
    assert missing - set(ELSEWHERE) == {
        "gateway_triton_errors_total",
        "gateway_spend_total",
        "gateway_shed_total",
        "gateway_queue_depth",
    }


async def test_requests_are_counted_by_route_template_model_and_status(
    http: httpx.AsyncClient,
) -> None:
    await http.post("/v1/chat/completions", json=chat_body())
    await http.get("/v1/sessions/abc")  # 404
    await http.post("/v1/chat/completions", json=chat_body(model="nope"))
    text = (await http.get("/metrics")).text
    assert (
        'gateway_requests_total{model="fake-chat",route="/v1/chat/completions",status="200"} 1.0'
        in text
    )
    # The route template, not the path: session ids do not become labels.
    assert 'route="/v1/sessions/{session_id}",status="404"' in text
    assert "abc" not in text
    # A model that does not exist is no label either: each made-up name would be a series.
    assert "nope" not in text
    assert 'gateway_requests_total{model="",route="/v1/chat/completions",status="404"} 1.0' in text
    assert re.search(r'gateway_completion_tokens_total\{model="fake-chat"\} [1-9]', text)
    assert re.search(r'gateway_prompt_tokens_total\{model="fake-chat"\} [1-9]', text)


async def test_rate_limit_rejections_are_counted(http: httpx.AsyncClient) -> None:
    key = (await new_key(http, rpm=1))["key"]
    for _ in range(3):
        await http.post("/v1/chat/completions", json=chat_body(), headers=bearer(key))
    text = (await http.get("/metrics")).text
    assert 'gateway_rate_limited_total{limit="requests"} 2.0' in text


async def test_metrics_can_require_an_admin_key() -> None:
    async with serve(make_settings(metrics_require_key=True)) as (app, http, _sdk):
        assert (await http.get("/metrics")).status_code == 200  # http sends the admin key
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver"
        ) as anon:
            assert (await anon.get("/metrics")).status_code == 401
        user = (await new_key(http))["key"]
        assert (await http.get("/metrics", headers=bearer(user))).status_code == 403


async def test_a_running_stream_is_in_flight_and_times_are_observed(
    http: httpx.AsyncClient, stream_http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.reply = " ".join(f"w{i}" for i in range(20))
    fake.token_delay_s = 0.01
    during = ""
    async with stream_http.stream(
        "POST", "/v1/chat/completions", json=chat_body(stream=True)
    ) as response:
        async for line in response.aiter_lines():
            if '"content":"w0' in line:
                during = (await http.get("/metrics")).text
    after = (await http.get("/metrics")).text
    flight = 'gateway_requests_in_flight{route="/v1/chat/completions"}'
    assert f"{flight} 1.0" in during
    assert f"{flight} 0.0" in after
    assert 'gateway_time_to_first_token_seconds_count{model="fake-chat"} 1.0' in after
    # 20 pieces: 19 gaps between them.
    assert 'gateway_inter_token_latency_seconds_count{model="fake-chat"} 19.0' in after
