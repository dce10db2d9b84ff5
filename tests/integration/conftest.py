"""Fixtures that run the real stack: Redis (redis-server), Triton (nvidia-pytriton wheel)
with the real models, the gateway under uvicorn, and the official openai client (sending
the admin key unless a test makes a key of its own)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway.stack.redis_server import EmbeddedRedis
from tests.redis_server import redis_server
from tests.stack import GatewayProcess

#: GATEWAY_MAX_AUDIO_UPLOAD_MB of the test stack (nginx's cap is one more).
UPLOAD_LIMIT_MB = 4


@pytest.fixture(scope="session")
def redis_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """The Redis the stack uses; tests may stop and restart it (its data persists)."""
    server = redis_server(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def stack(redis_store: EmbeddedRedis) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(
        models=["smollm2", "mock_chat", "piper_tts", "whisper_stt", "e5_small"],
        redis_url=redis_store.url,
        # Small, so that the upload-limit tests send a few MB, not 25.
        env={"GATEWAY_MAX_AUDIO_UPLOAD_MB": str(UPLOAD_LIMIT_MB)},
    ).start()
    try:
        gateway.wait_ready()
        yield gateway
    finally:
        code = gateway.stop()
    # Leaving the session must shut the stack down cleanly (SIGTERM -> exit 0).
    assert code == 0, gateway.output()


@pytest.fixture(scope="session")
def client(stack: GatewayProcess) -> openai.OpenAI:
    return stack.client()


@pytest.fixture
def aclient(stack: GatewayProcess) -> openai.AsyncOpenAI:
    return stack.async_client()


def generated_tokens(stack: GatewayProcess, model: str) -> float:
    """Triton's custom metric of tokens the model generated (see triton_repo/README.md)."""
    text = httpx.get(stack.triton_metrics, timeout=5).text
    match = re.search(rf'^model_generated_tokens_total{{model="{model}"}} (\S+)$', text, re.M)
    assert match, f"no token metric for {model} in Triton's /metrics"
    return float(match.group(1))
