"""Fixtures that run the real stack: Triton (nvidia-pytriton wheel) with the real SmolLM2
and the mock chat model, the gateway under uvicorn, and the official openai client."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.stack import GatewayProcess


@pytest.fixture(scope="session")
def stack() -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(models=["smollm2", "mock_chat", "piper_tts", "whisper_stt"]).start()
    try:
        gateway.wait_ready()
        yield gateway
    finally:
        code = gateway.stop()
    # Leaving the session must shut the stack down cleanly (SIGTERM -> exit 0).
    assert code == 0, gateway.output()


@pytest.fixture(scope="session")
def client(stack: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)


@pytest.fixture
def aclient(stack: GatewayProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)


def generated_tokens(stack: GatewayProcess, model: str) -> float:
    """Triton's custom metric of tokens the model generated (see triton_repo/README.md)."""
    text = httpx.get(stack.triton_metrics, timeout=5).text
    match = re.search(rf'^model_generated_tokens_total{{model="{model}"}} (\S+)$', text, re.M)
    assert match, f"no token metric for {model} in Triton's /metrics"
    return float(match.group(1))
