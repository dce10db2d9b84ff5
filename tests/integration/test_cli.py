"""``gateway up`` as an operator meets it: clear failures, supervision, clean shutdown."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import openai
import pytest

from tests.stack import ROOT, GatewayProcess, free_port

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
    gateway = GatewayProcess(triton_url=f"127.0.0.1:{free_port()}").start()
    try:
        gateway.wait_ready(60, path="/health/live")
        assert httpx.get(gateway.base_url + "/health/ready").status_code == 503
        client = gateway.client()
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "hi"}]
            )
        assert info.value.status_code == 503
        assert info.value.body["code"] == "backend_unavailable"
        assert httpx.get(gateway.base_url + "/health/live").status_code == 200
    finally:
        assert gateway.stop() == 0
