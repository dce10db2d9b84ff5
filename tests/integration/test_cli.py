"""``gateway up`` as an operator meets it: clear failures, supervision, clean shutdown."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys

import httpx
import openai
import pytest
import redis

from tests.support.stack import ROOT, GatewayProcess, free_port

pytestmark = pytest.mark.integration


def test_taken_port_fails_with_a_clear_message() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "up", "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"port {port} (OpenAI API) is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_triton_gives_503_and_the_gateway_keeps_serving() -> None:
    triton_port = free_port()
    started = GatewayProcess(triton_url=f"127.0.0.1:{triton_port}")
    with started.running(60, path="/health/live", clean_exit=True) as gateway:
        assert httpx.get(gateway.base_url + "/health/ready").status_code == 503
        client = gateway.client()
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "hi"}]
            )
        assert info.value.status_code == 503
        assert info.value.body["code"] == "backend_unavailable"
        # No peer address: the client gets the request id nginx gave it, the log the rest.
        message = info.value.body["message"]
        assert "127.0.0.1" not in message and str(triton_port) not in message
        request_id = info.value.response.headers["x-request-id"]
        assert request_id in message
        assert httpx.get(gateway.base_url + "/health/live").status_code == 200
        _embedded_redis_is_private(gateway)
    assert f"request {request_id}: " in gateway.output()


def _embedded_redis_is_private(gateway: GatewayProcess) -> None:
    """The embedded Redis wants the password ``gateway up`` keeps in its run dir (600),
    which every replica has, and which nothing printed; it is bounded in memory."""
    with redis.Redis(port=gateway.redis_port) as anonymous, pytest.raises(redis.RedisError):
        anonymous.set("gw:key:{forged}", '{"role": "admin"}')
    kept = gateway.run_dir / f"gateway-{gateway.port}" / "redis_password"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    password = kept.read_text().strip()
    assert password not in gateway.output()
    # Both replicas write keys, limits and usage with it.
    for _ in range(4):
        gateway.create_key("private")
    with redis.Redis(port=gateway.redis_port, password=password) as owner:
        assert owner.config_get("maxmemory")["maxmemory"] == str(512 * 1024 * 1024)
        assert owner.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert owner.scard("gw:keys") == 4
