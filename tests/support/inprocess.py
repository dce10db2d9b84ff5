"""The gateway app run in process on the fake backend and the test session's Redis (started
by ``tests/unit/conftest.py``'s ``redis_server`` fixture): its settings, the app with an
httpx and an openai client, keys made through the admin API.

Clients send the admin key (:data:`ADMIN_KEY`) unless a test says otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
from fastapi import FastAPI

from gateway.app import create_app
from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.stack.redis_server import EmbeddedRedis

BASE_URL = "http://testserver"
ADMIN_KEY = "sk-gw-Qm7v2Xr9Lp4Kd8Wn3Zb6Hc1Ty5Fj0Gs"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
#: The Redis of this test session (set by the ``redis_server`` fixture).
REDIS: EmbeddedRedis | None = None
#: The words FakeBackend answers with by default.
REPLY = "Hello from the fake backend."


def make_settings(**overrides: Any) -> Settings:
    """Settings that ignore any ``.env`` file; defaults suited to the fake backend."""
    assert REDIS is not None, "the redis_server fixture starts Redis first"
    values: dict[str, Any] = {
        "models": ["fake-chat"],
        "model_cache_ttl_s": 3600.0,
        "redis_url": REDIS.url,
        "admin_key": ADMIN_KEY,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@asynccontextmanager
async def serve(
    settings: Settings | None = None, backend: FakeBackend | None = None
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI]]:
    """Runs the app (lifespan included) and yields it with an httpx and an openai client.
    httpx's ASGITransport neither runs the lifespan (so this does) nor streams (it buffers
    the whole body: :class:`tests.support.asgi.StreamingASGITransport` does)."""
    app = create_app(settings or make_settings(), backend=backend or FakeBackend())
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=BASE_URL, headers=AUTH
        ) as http,
    ):
        sdk = openai.AsyncOpenAI(
            base_url=f"{BASE_URL}/v1", api_key=ADMIN_KEY, http_client=http, max_retries=0
        )
        yield app, http, sdk


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def new_key(http: httpx.AsyncClient, **spec: Any) -> dict[str, Any]:
    """Creates a key through the admin API (``http`` sends the admin key)."""
    response = await http.post("/admin/keys", json={"name": "test key", **spec})
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def sdk(http: httpx.AsyncClient, key: str) -> openai.AsyncOpenAI:
    """The openai SDK over ``http``'s app, sending ``key``."""
    return openai.AsyncOpenAI(
        base_url=f"{BASE_URL}/v1", api_key=key, http_client=http, max_retries=0
    )
