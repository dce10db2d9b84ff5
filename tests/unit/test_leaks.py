"""What must never reach a client or a log: internals in error bodies (peer addresses,
Redis's and Triton's own words, tracebacks) and secrets (passwords, keys); and the secrets
``gateway up`` keeps, each in a file only its owner can read from the moment it exists."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway import cli
from gateway.app import create_app
from gateway.backend.triton_errors import model_error, status_error
from gateway.config import Settings
from gateway.stack import up as stack_up
from gateway.stack.credentials import admin_key, redis_password
from gateway.stack.redis_server import EmbeddedRedis, EmbeddedRedisError
from gateway.stack.replicas import settings_env
from gateway.stack.triton_server import EmbeddedTritonError, free_port
from gateway.state.redis import connect
from tests.support.bodies import assert_openai_error, chat_body
from tests.support.inprocess import AUTH, BASE_URL, bearer, make_settings, new_key, serve
from tests.support.redis_server import redis_server

# Many requests, then a wait for memory to settle: handed out with the long groups
# (tests/conftest.py).
pytestmark = pytest.mark.long

CHAT = "/v1/chat/completions"


@asynccontextmanager
async def _with_triton_at(url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its real Triton client (no fake backend), talking to ``url``."""
    app = create_app(make_settings(triton_url=url, triton_timeout_s=2.0))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=AUTH) as http,
    ):
        yield http


async def test_an_unreachable_triton_is_a_503_that_names_no_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    async with _with_triton_at(f"127.0.0.1:{port}") as http:
        with caplog.at_level(logging.WARNING, logger="gateway"):
            response = await http.get("/v1/models", headers={"X-Request-ID": "req-leak.1"})
    error = assert_openai_error(response, 503, code="backend_unavailable", type="server_error")
    # gRPC says "ipv4:127.0.0.1:<port>: Failed to connect to remote host": not for clients.
    for internal in ("127.0.0.1", str(port), "ipv4", "connect"):
        assert internal not in response.text
    assert "req-leak.1" in error["message"]
    assert response.headers["x-request-id"] == "req-leak.1"
    # The operator finds what gRPC said in the log, under the same request id.
    [logged] = [r.getMessage() for r in caplog.records if "req-leak.1" in r.getMessage()]
    assert f"127.0.0.1:{port}" in logged


TRACEBACK = (
    'Traceback (most recent call last):\n  File "/models/tensorrt_llm_bls/1/model.py", '
    'line 108, in execute\nKeyError: "pad_id"'
)


def test_triton_words_reach_the_client_only_when_they_are_about_its_input() -> None:
    failures = [
        # A Python-backend model's failure, as TensorRT-LLM's BLS sends every one.
        model_error("llm", TRACEBACK),
        status_error("INTERNAL", TRACEBACK, "llm"),
        status_error("UNAVAILABLE", "failed to connect to all addresses; ipv4:10.0.3.7:8001"),
        status_error("DEADLINE_EXCEEDED", "Deadline Exceeded at ipv4:10.0.3.7:8001", "llm"),
    ]
    for failure in failures:
        message = failure.body()["error"]["message"]
        for internal in ("Traceback", "/models/", "model.py", "10.0.3.7", "pad_id"):
            assert internal not in message
        assert failure.detail is not None  # for the log
        assert "Traceback" in failure.detail or "10.0.3.7" in failure.detail
    # INVALID_ARGUMENT and a prompt too long are about the client's own input, which the
    # client must read to fix it; they name no internals.
    refused = status_error("INVALID_ARGUMENT", "max_tokens must be a single value > 0", "llm")
    assert refused.status_code == 400
    assert "max_tokens must be a single value > 0" in refused.message
    too_long = model_error("llm", "This model's maximum context length is 2048 tokens.")
    assert too_long.status_code == 400
    assert "maximum context length is 2048" in too_long.message


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = redis_server(tmp_path)
    try:
        yield server
    finally:
        server.stop()


async def test_a_full_redis_is_a_clear_503_not_its_error_text(own_redis: EmbeddedRedis) -> None:
    async with serve(make_settings(redis_url=own_redis.url)) as (_, http, _sdk):
        key = (await new_key(http, rpm=100))["key"]
        with redis.Redis.from_url(own_redis.url) as admin:
            admin.config_set("maxmemory", 1)  # every write is now refused: OOM
        response = await http.post(CHAT, json=chat_body(), headers=bearer(key))
    error = assert_openai_error(response, 503, code="store_full", type="server_error")
    assert response.headers["retry-after"]
    assert "full" in error["message"]
    for internal in ("OOM", "maxmemory", "command not allowed", "script"):
        assert internal not in response.text


async def test_stored_conversations_leave_redis_room_for_every_keys_requests(
    own_redis: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small Redis's memory moves a lot with its connections: a low share leaves room.
    monkeypatch.setattr("gateway.state.headroom.STORED_SHARE", 0.3)
    async with serve(make_settings(redis_url=own_redis.url)) as (_, http, _sdk):
        key = (await new_key(http, rpm=100, tpm=10_000))["key"]
        with redis.Redis.from_url(own_redis.url) as admin:
            used = int(admin.info("memory")["used_memory"])
            admin.config_set("maxmemory", used * 2)  # half full: past the share
        stored = await http.post(
            "/v1/responses", json={"model": "fake-chat", "input": "Hi"}, headers=bearer(key)
        )
        assert_openai_error(stored, 503, code="store_full")
        # Requests that store nothing are still admitted, limited and metered.
        chat = await http.post(CHAT, json=chat_body(), headers=bearer(key))
        assert chat.status_code == 200, chat.text
        unstored = await http.post(
            "/v1/responses",
            json={"model": "fake-chat", "input": "Hi", "store": False},
            headers=bearer(key),
        )
        assert unstored.status_code == 200, unstored.text


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://:s3cret-pw@127.0.0.1:26379",  # no service name
        "redis+cluster://:s3cret-pw@127.0.0.1:7000/1",  # a cluster has no database
        "redis+cluster://:s3cret-pw@127.0.0.1",  # no port
    ],
)
def test_a_refused_redis_url_is_shown_without_its_password(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        connect(url, 1.0, 8)
    assert "s3cret-pw" not in str(refused.value)
    assert "127.0.0.1" in str(refused.value)


def test_the_embedded_redis_needs_its_password_and_has_a_memory_limit(tmp_path: Path) -> None:
    password = 'a "quoted" pass\\word'
    embedded = EmbeddedRedis(tmp_path / "redis", free_port(), password=password, maxmemory_mb=32)
    embedded.start()
    try:
        with redis.Redis(port=embedded.port) as anonymous, pytest.raises(redis.RedisError):
            anonymous.set("gw:key:{x}", '{"role": "admin"}')
        with redis.Redis.from_url(embedded.url) as client:
            assert client.config_get("maxmemory")["maxmemory"] == str(32 * 1024 * 1024)
            assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert embedded.process is not None
        # Any local user can read a command line: the password is not on it.
        assert "quoted" not in Path(f"/proc/{embedded.process.pid}/cmdline").read_text()
        assert stat.S_IMODE((tmp_path / "redis").stat().st_mode) == 0o700
    finally:
        embedded.stop()


def _up_settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(_env_file=None, run_dir=tmp_path / "run", **values)  # type: ignore[call-arg]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def no_chmod(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A file is private from its creation, not from a chmod after it was written (while
    it was readable); the widest umask shows which."""
    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_the_generated_admin_key_is_private_from_its_creation(
    tmp_path: Path, no_chmod: None, capsys: pytest.CaptureFixture[str]
) -> None:
    key = admin_key(_up_settings(tmp_path)).admin_key
    assert key is not None
    kept = tmp_path / "run" / "admin_key"
    assert _mode(kept) == 0o600
    assert kept.read_text().strip() == key.get_secret_value()
    # A later start reuses it and does not print it again.
    assert admin_key(_up_settings(tmp_path)).admin_key == key
    assert capsys.readouterr().out.count(key.get_secret_value()) == 1


def test_the_embedded_redis_password_is_kept_private_and_reaches_every_replica(
    tmp_path: Path, no_chmod: None
) -> None:
    port = free_port()
    settings = redis_password(_up_settings(tmp_path, redis_url=f"redis://127.0.0.1:{port}/2"))
    kept = tmp_path / "run" / "redis_password"
    assert _mode(kept) == 0o600
    password = kept.read_text().strip()
    # The replicas' URL carries it, with the database of the operator's URL.
    url = settings_env(settings)["GATEWAY_REDIS_URL"]
    assert url == f"redis://:{password}@127.0.0.1:{port}/2"
    embedded = stack_up._redis(settings)
    assert (embedded.password, embedded.maxmemory_mb) == (password, settings.redis_maxmemory_mb)
    # The same password on the next start: the data and the replicas keep working.
    again = redis_password(_up_settings(tmp_path, redis_url=f"redis://127.0.0.1:{port}/2"))
    assert again.redis_url == url


def test_gateway_keys_reaches_the_embedded_redis_with_its_kept_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    up = redis_password(_up_settings(tmp_path, redis_url=f"redis://127.0.0.1:{free_port()}"))
    embedded = stack_up._redis(up).start()
    try:
        monkeypatch.setenv("GATEWAY_RUN_DIR", str(tmp_path / "run"))
        monkeypatch.setenv("GATEWAY_REDIS_URL", f"redis://127.0.0.1:{embedded.port}")
        assert cli.main(["keys", "create", "--name", "ops", "--json"]) == 0
        created = capsys.readouterr().out
        assert '"name":"ops"' in created
        assert embedded.password is not None and embedded.password not in created
    finally:
        embedded.stop()


def test_a_redis_the_gateway_does_not_start_keeps_its_url(tmp_path: Path) -> None:
    own = _up_settings(tmp_path, redis_url="redis://127.0.0.1:6379/0", embedded_redis=False)
    assert redis_password(own) == own
    url = f"redis://:my%20own@127.0.0.1:{free_port()}/0"
    settings = redis_password(_up_settings(tmp_path, redis_url=url))
    assert settings.redis_url == url
    assert stack_up._redis(settings).password == "my own"
    assert not (tmp_path / "run" / "redis_password").exists()


def test_the_embedded_servers_listen_on_loopback_only(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedRedisError, match="loopback only"):
        stack_up._redis(_up_settings(tmp_path, redis_url="redis://0.0.0.0:6379/0"))
    with pytest.raises(EmbeddedTritonError, match="loopback only"):
        stack_up._triton(_up_settings(tmp_path, triton_url="10.1.2.3:8001"))
