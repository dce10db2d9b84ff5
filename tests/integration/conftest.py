"""Fixtures that run the real stack: Redis (redis-server), Triton (nvidia-pytriton wheel)
with the real models, the gateway under uvicorn, and the official openai client (sending
the admin key unless a test makes a key of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from gateway.stack.redis_server import EmbeddedRedis
from tests.support.redis_server import redis_server
from tests.support.shared_stack import byte_tokenizer, shared_stack
from tests.support.stack import GatewayProcess


@pytest.fixture(scope="session")
def redis_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """The Redis the stack uses; tests may stop and restart it (its data persists)."""
    server = redis_server(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def stack(
    redis_store: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """The stack the integration modules share (:func:`tests.support.shared_stack.shared_stack`).
    Leaving the session must shut it down cleanly (SIGTERM -> exit 0)."""
    tokenizer = byte_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    with shared_stack(redis_store.url, tokenizer).running(clean_exit=True) as gateway:
        yield gateway


@pytest.fixture(scope="session")
def client(stack: GatewayProcess) -> openai.OpenAI:
    return stack.client()


@pytest.fixture
def aclient(stack: GatewayProcess) -> openai.AsyncOpenAI:
    return stack.async_client()
