"""/metrics: what operators and the Grafana dashboard read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from gateway.backend import ModelInfo
from gateway.backend.fake import FakeBackend
from gateway.config import CHATML_TEMPLATE
from gateway.metrics import UNKNOWN_MODEL, Metrics, ModelLabelled
from tests.support.audio import tone_file
from tests.support.bodies import chat_body
from tests.support.inprocess import bearer, make_settings, new_key, serve
from tests.support.monitoring import ELSEWHERE

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


#: A made-up model name as long as a body may carry (each one a series, if it were a label).
MADE_UP = "made-up-" + "x" * 20_000


def _series(text: str) -> set[str]:
    """Every series of an exposition: its name and labels, without its value."""
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#"}


async def _refusals(http: httpx.AsyncClient, model: str) -> list[int]:
    """A request naming ``model`` on each path that refuses it after the key let it use the
    name, and before any lookup of the model; the statuses they got."""
    bound = (await new_key(http, priority=5))["key"]  # may not ask for priority 0
    tone = tone_file(1)
    sent = [
        await http.post("/v1/chat/completions", json=chat_body(model=model, logit_bias={"1": 1})),
        await http.post("/v1/chat/completions", json=chat_body(model=model, verbosity="low")),
        await http.post(
            "/v1/chat/completions", json=chat_body(model=model, priority=0), headers=bearer(bound)
        ),
        await http.post("/v1/embeddings", json={"model": model, "input": "a", "priority": -100}),
        await http.post(
            "/v1/audio/transcriptions", data={"model": model}, files={"file": ("a.wav", tone)}
        ),
        await http.post("/v1/chat/completions", json=chat_body(model=model)),  # 404
    ]
    return [response.status_code for response in sent]


async def test_a_made_up_model_is_never_a_label_whatever_refused_it() -> None:
    # The tone file is over the upload limit: a 413 after the model was named.
    async with serve(make_settings(max_audio_upload_mb=0.01)) as (_, http, _sdk):
        assert (await http.post("/v1/chat/completions", json=chat_body())).status_code == 200
        assert await _refusals(http, MADE_UP) == [400, 400, 400, 400, 413, 404]
        text = (await http.get("/metrics")).text
        assert "x" * 100 not in text
        assert len(text) < 40_000  # one such name would be half as long again
        for status in ("400", "413"):
            assert re.search(
                rf'gateway_requests_total{{model="unknown",route="[^"]+",status="{status}"}}', text
            )
        assert 'gateway_requests_total{model="",route="/v1/chat/completions",status="404"}' in text
        # Real models keep their names.
        assert 'model="fake-chat",route="/v1/chat/completions",status="200"' in text
        # More made-up names on every path: more counts, no new series.
        for n in range(3):
            assert len(set(await _refusals(http, f"{MADE_UP}-{n}"))) > 1
        again = (await http.get("/metrics")).text
        # (but /metrics itself, counted once it was first read)
        assert {s for s in _series(again) - _series(text) if "/metrics" not in s} == set()


async def test_models_the_catalog_reads_are_labels_lora_adapters_included() -> None:
    fake = FakeBackend()
    fake.model_list.append(
        ModelInfo("fake-lora", "chat", True, CHATML_TEMPLATE, 2048, adapters=("sql",))
    )
    async with serve(make_settings(), fake) as (_, http, _sdk):
        # Refused before its model was looked up, but a model the catalog has read.
        await http.get("/v1/models")
        refused = await http.post(
            "/v1/chat/completions", json=chat_body(model="fake-lora:sql", logit_bias={"1": 1})
        )
        assert refused.status_code == 400
        served = await http.post("/v1/chat/completions", json=chat_body(model="fake-lora:sql"))
        assert served.status_code == 200
        text = (await http.get("/metrics")).text
    assert 'model="fake-lora:sql",route="/v1/chat/completions",status="400"' in text
    assert 'model="fake-lora:sql",route="/v1/chat/completions",status="200"' in text
    assert re.search(r'gateway_completion_tokens_total\{model="fake-lora:sql"\} [1-9]', text)


def test_every_family_with_a_model_label_maps_it() -> None:
    """A family added later with a ``model`` label must go through the same mapping."""
    metrics = Metrics()
    metrics.models_read(["real"], {"real": True})
    families = {
        name: value
        for name, value in vars(metrics).items()
        if isinstance(value, Counter | Gauge | Histogram | ModelLabelled)
    }
    with_model = {
        name
        for name, value in families.items()
        if "model" in getattr(value, "family", value)._labelnames
    }
    assert len(with_model) >= 14
    assert {n for n in with_model if not isinstance(families[n], ModelLabelled)} == set()
    for name in sorted(with_model):
        family = families[name]
        assert isinstance(family, ModelLabelled)
        names = list(family.family._labelnames)
        values = ["x" * 50 if label == "model" else label for label in names]
        child = family.labels(*values)
        known = family.labels(*["real" if label == "model" else label for label in names])
        assert child is family.family.labels(
            *[UNKNOWN_MODEL if label == "model" else label for label in names]
        )
        assert known is family.family.labels(
            *["real" if label == "model" else label for label in names]
        )
    assert "x" * 50 not in metrics.render()[0].decode()


def test_a_metrics_file_another_process_is_making_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A replica that starts while another makes its file (empty for an instant) starts, and
    # a scrape then answers: reading the empty file raised struct.error.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    written = MmapedDict(str(tmp_path / "counter_4241.db"))  # a process's, written
    written.write_value(mmap_key("gateway_t_total", "gateway_t_total", (), (), "t"), 3.0, 0.0)
    written.close()
    (tmp_path / "counter_4242.db").write_bytes(b"")  # another's, being made
    body, _ = Metrics().render()
    assert b"gateway_t_total 3.0" in body
