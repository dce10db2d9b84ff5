"""Liveness and readiness probes."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx

from gateway.backend import ModelInfo
from gateway.backend.fake import FakeBackend
from gateway.backend.pool import BackendPool
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import make_settings, serve
from tests.support.redis_server import redis_server


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


async def test_gateway_redis_up_follows_redis_traffic_or_none(tmp_path: Path) -> None:
    own = redis_server(tmp_path)

    async def redis_up(http: httpx.AsyncClient) -> str:
        metrics = (await http.get("/metrics")).text
        return re.findall(r"^gateway_redis_up (\S+)$", metrics, re.M)[0]

    async def becomes(http: httpx.AsyncClient, value: str) -> None:
        deadline = time.monotonic() + 5
        for _ in range(200):
            if (seen := await redis_up(http)) == value or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert seen == value

    try:
        settings = make_settings(redis_url=own.url, redis_timeout_s=0.2, redis_check_interval_s=0.1)
        async with serve(settings) as (_, http, _sdk):
            await becomes(http, "1.0")  # checked at start
            own.stop()
            await becomes(http, "0.0")  # by the background check: no request needed
            own.start()
            await becomes(http, "1.0")
    finally:
        own.stop()


async def test_the_readiness_probe_sets_gateway_redis_up(tmp_path: Path) -> None:
    own = redis_server(tmp_path)
    try:
        # Background checks too rare to matter here: the probe's own check is what counts.
        settings = make_settings(redis_url=own.url, redis_timeout_s=0.2, redis_check_interval_s=300)
        async with serve(settings) as (_, http, _sdk):
            own.stop()
            assert_openai_error(await http.get("/health/ready"), 503, code="store_unavailable")
            assert "gateway_redis_up 0.0" in (await http.get("/metrics")).text
    finally:
        own.stop()


async def test_a_gateway_stopped_while_its_redis_check_runs_stops(tmp_path: Path) -> None:
    """The background Redis check is cancelled whatever it is doing (connecting, waiting for
    its answer), so the app's shutdown never waits for it."""
    own = redis_server(tmp_path)
    try:
        for _ in range(30):
            async with asyncio.timeout(5), serve(make_settings(redis_url=own.url)):
                pass
    finally:
        own.stop()


#: What Triton says of a Python model whose initialize() raised.
BROKEN_REASON = "Failed to load 'broken' version 1: Internal: RuntimeError: no weights"


async def test_a_model_that_failed_to_load_leaves_the_replica_in_rotation(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    fake.fail("broken", BROKEN_REASON)
    ready = await http.get("/health/ready")
    assert ready.status_code == 200, ready.text
    assert ready.json() == {"status": "ready", "models": ["fake-chat"]}
    assert BROKEN_REASON not in ready.text  # the probe is open to anyone
    # The models that serve go on.
    chat = await http.post("/v1/chat/completions", json=chat_body())
    assert chat.status_code == 200, chat.text
    # Users list what they can use; the operator sees the failure and why.
    listed = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
    assert "broken" not in listed and "fake-chat" in listed
    assert_openai_error(
        await http.post("/v1/chat/completions", json=chat_body(model="broken")),
        404,
        code="model_not_found",
    )
    admin = {m["id"]: m for m in (await http.get("/admin/models")).json()["data"]}
    assert admin["broken"]["status"] == "failed"
    assert admin["broken"]["state"] == "UNAVAILABLE"
    assert admin["broken"]["reason"] == BROKEN_REASON
    assert admin["fake-chat"]["status"] == "ready"
    assert admin["fake-unloaded"]["status"] == "not_loaded"
    text = (await http.get("/metrics")).text
    assert 'gateway_model_ready{model="broken"} 0.0' in text
    assert 'gateway_model_ready{model="fake-chat"} 1.0' in text
    assert 'model="fake-unloaded"' not in text  # never loaded: no series


async def test_a_configured_model_that_failed_to_load_is_not_ready(fake: FakeBackend) -> None:
    fake.fail("broken", BROKEN_REASON)
    async with serve(make_settings(models=["fake-chat", "broken"]), fake) as (_, http, _sdk):
        error = assert_openai_error(await http.get("/health/ready"), 503, code="not_ready")
    assert error["message"].startswith("Models not ready: broken (request id: ")
    assert "Failed" not in error["message"]  # Triton's reason is the operator's


async def test_a_model_that_stops_serving_shows_in_gateway_model_ready(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    assert (await http.get("/health/ready")).status_code == 200
    assert 'gateway_model_ready{model="fake-plain"} 1.0' in (await http.get("/metrics")).text
    fake.fail("fake-plain")  # its folder removed, say, and a reload failed
    assert (await http.get("/health/ready")).status_code == 200
    assert 'gateway_model_ready{model="fake-plain"} 0.0' in (await http.get("/metrics")).text
    fake.model_list = [m for m in fake.model_list if m.name != "fake-plain"]  # gone from it
    assert (await http.get("/health/ready")).status_code == 200
    assert 'gateway_model_ready{model="fake-plain"} 0.0' in (await http.get("/metrics")).text
    await http.post("/admin/models/fake-unloaded/load")
    assert 'gateway_model_ready{model="fake-unloaded"} 1.0' in (await http.get("/metrics")).text


async def test_several_tritons_show_the_state_that_tells_most() -> None:
    """A model ready on one server is ready (and the replica too); failed on every server,
    it shows one server's failure, not another's never loaded."""
    fakes = {"a:1": FakeBackend(), "b:1": FakeBackend()}
    fakes["a:1"].fail("fake-chat", BROKEN_REASON)
    fakes["a:1"].model_list.append(ModelInfo("broken", None, False))
    fakes["b:1"].fail("broken", BROKEN_REASON)
    pool = BackendPool("a:1,b:1", fakes.__getitem__, check_every_s=3600)  # type: ignore[arg-type]
    try:
        assert await pool.live()
        states = {m.name: m for m in await pool.models()}
        assert states["fake-chat"].ready
        assert states["broken"].status == "failed"
        assert states["broken"].reason == BROKEN_REASON
        entries = {e.name: e for e in await pool.repository()}
        assert entries["fake-chat"].status == "ready"
        assert entries["broken"].reason == BROKEN_REASON
    finally:
        await pool.close()
