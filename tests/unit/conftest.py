"""Fixtures that run the gateway app in-process against the in-memory FakeBackend and a
real ``redis-server`` (one per test session, flushed before each test); the helpers they
use, and tests import, are in ``tests/support/`` (``inprocess.py``, ``asgi.py``).

Clients send the admin key (:data:`tests.support.inprocess.ADMIN_KEY`) unless a test says
otherwise.

``http`` is a plain httpx client (status codes, headers, raw SSE), ``client`` the official
openai SDK over the same app. httpx's ASGITransport neither runs the lifespan (so the
fixtures run it) nor streams (it buffers the whole body), so ``stream_http`` (over
:class:`tests.support.asgi.StreamingASGITransport`) is there for tests that must stop
reading a stream early.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest
import redis
from fastapi import FastAPI

from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.stack.redis_server import EmbeddedRedis
from tests.support import inprocess
from tests.support.asgi import StreamingASGITransport
from tests.support.inprocess import AUTH, BASE_URL, make_settings, serve
from tests.support.redis_server import redis_server as start_redis


@pytest.fixture(scope="session", autouse=True)
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """The session's Redis, which :func:`tests.support.inprocess.make_settings` points at."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    inprocess.REDIS = server
    try:
        yield server
    finally:
        server.stop()
        inprocess.REDIS = None


@pytest.fixture(autouse=True)
def _empty_redis(redis_server: EmbeddedRedis) -> None:
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()


@pytest.fixture(autouse=True)
def _no_gateway_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """GATEWAY_* variables of the machine running the tests must not change them."""
    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)
    yield


@pytest.fixture
def fake() -> FakeBackend:
    """The backend of the ``app``; tests may change it (``up``, ``fail_after_tokens``...)."""
    return FakeBackend()


@pytest.fixture
def settings() -> Settings:
    return make_settings()


@pytest.fixture
async def served(
    settings: Settings, fake: FakeBackend
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI]]:
    async with serve(settings, fake) as parts:
        yield parts


@pytest.fixture
def app(served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI]) -> FastAPI:
    return served[0]


@pytest.fixture
def http(served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI]) -> httpx.AsyncClient:
    return served[1]


@pytest.fixture
def client(served: tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI]) -> openai.AsyncOpenAI:
    return served[2]


@pytest.fixture
async def anon(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client for the app that sends no API key."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as h:
        yield h


@pytest.fixture
async def stream_http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client that receives the body while the app still produces it."""
    transport = StreamingASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=AUTH) as http:
        yield http
