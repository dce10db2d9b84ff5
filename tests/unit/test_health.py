"""Liveness and readiness probes."""

from __future__ import annotations

import httpx

from gateway.backend.fake import FakeBackend
from tests.unit.conftest import assert_openai_error, make_settings, serve


async def test_live(http: httpx.AsyncClient) -> None:
    response = await http.get("/health/live")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response.headers["content-type"] == "application/json"
    head = await http.head("/health/live")
    assert head.status_code == 200 and head.content == b""
    # Probes are counted like any request.
    metrics = (await http.get("/metrics")).text
    assert 'gateway_requests_total{model="",route="/health/live",status="200"} 2.0' in metrics


async def test_ready_when_backend_up_and_required_models_loaded(http: httpx.AsyncClient) -> None:
    response = await http.get("/health/ready")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "models": ["fake-chat"]}


async def test_not_ready_when_a_required_model_is_missing() -> None:
    async with serve(make_settings(models=["fake-chat", "nope"])) as (_, http, _sdk):
        error = assert_openai_error(await http.get("/health/ready"), 503, code="not_ready")
    assert "nope" in error["message"]
    assert "fake-chat" not in error["message"]


async def test_not_ready_when_a_required_model_is_not_loaded() -> None:
    async with serve(make_settings(models=["fake-unloaded"])) as (_, http, _sdk):
        assert_openai_error(await http.get("/health/ready"), 503, code="not_ready")


async def test_not_ready_when_backend_down(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    fake.up = False
    assert_openai_error(await http.get("/health/ready"), 503, type="server_error")
    # Liveness is about the gateway process only.
    assert (await http.get("/health/live")).status_code == 200


async def test_ready_follows_the_backend_without_waiting_for_the_cache_ttl(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    # The probe must see a model unloaded a moment ago, even with a long model cache TTL.
    assert (await http.get("/health/ready")).status_code == 200
    fake.model_list = [m for m in fake.model_list if m.name != "fake-chat"]
    assert_openai_error(await http.get("/health/ready"), 503, code="not_ready")
