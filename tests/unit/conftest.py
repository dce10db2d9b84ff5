"""Fixtures that run the gateway app in-process against the in-memory FakeBackend and a
real ``redis-server`` (one per test session, flushed before each test).

Clients send the admin key (:data:`ADMIN_KEY`) unless a test says otherwise.

``http`` is a plain httpx client (status codes, headers, raw SSE), ``client`` the official
openai SDK over the same app. httpx's ASGITransport neither runs the lifespan (so the
fixtures run it) nor streams (it buffers the whole body), so :class:`StreamingASGITransport`
is there for tests that must stop reading a stream early.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest
import redis
from fastapi import FastAPI

from gateway.app import create_app
from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.stack.redis_server import EmbeddedRedis
from tests.redis_server import redis_server as start_redis

BASE_URL = "http://testserver"
ADMIN_KEY = "sk-gw-Qm7v2Xr9Lp4Kd8Wn3Zb6Hc1Ty5Fj0Gs"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
#: The Redis of this test session (set by the ``redis_server`` fixture).
REDIS: EmbeddedRedis | None = None
#: The words FakeBackend answers with by default.
REPLY = "Hello from the fake backend."
USER_HI = [{"role": "user", "content": "Hi"}]


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


def chat_body(**fields: Any) -> dict[str, Any]:
    """A valid chat request for ``fake-chat``; ``fields`` add or replace parameters."""
    return {"model": "fake-chat", "messages": USER_HI, **fields}


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order (``[DONE]`` included)."""
    assert text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-40:]!r}"
    events = []
    for block in text.split("\n\n"):
        if block:
            assert block.startswith("data: "), f"not an SSE data event: {block!r}"
            events.append(block.removeprefix("data: "))
    return events


def sse_json(text: str) -> list[dict[str, Any]]:
    """The JSON events of an SSE body, checking that it ends with exactly one ``[DONE]``."""
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    assert "[DONE]" not in events[:-1]
    return [json.loads(e) for e in events[:-1]]


async def until(check: Callable[[], object], what: str) -> None:
    """Waits (up to a second) for ``check()`` to be true: for what a task started a moment
    ago does, on a machine whose other work may delay it."""
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(what)


def assert_openai_error(response: httpx.Response, status: int, **fields: Any) -> dict[str, Any]:
    """Checks the status and the OpenAI error body; ``fields`` are expected error fields."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    for key, value in fields.items():
        assert error[key] == value, f"error.{key}: {error[key]!r} != {value!r} ({error})"
    return error


@asynccontextmanager
async def serve(
    settings: Settings | None = None, backend: FakeBackend | None = None
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, openai.AsyncOpenAI]]:
    """Runs the app (lifespan included) and yields it with an httpx and an openai client."""
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


@pytest.fixture(scope="session", autouse=True)
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    global REDIS
    server = start_redis(tmp_path_factory.mktemp("redis"))
    REDIS = server
    try:
        yield server
    finally:
        server.stop()
        REDIS = None


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


@pytest.fixture
async def stream_http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client that receives the body while the app still produces it."""
    transport = StreamingASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=AUTH) as http:
        yield http


def asgi_scope(request: httpx.Request) -> dict[str, Any]:
    """The ASGI scope a server makes of ``request`` (its headers as sent, duplicates kept),
    for tests that drive the app's ASGI callable themselves."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "scheme": request.url.scheme,
        "path": request.url.path,
        "raw_path": request.url.raw_path.split(b"?")[0],
        "query_string": request.url.query,
        "server": (request.url.host, request.url.port),
        "client": ("127.0.0.1", 123),
        "root_path": "",
    }


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Runs the ASGI app in a task and hands each body message to the client as it is sent.
    Closing the response tells the app the client disconnected, as a server does when the
    socket closes, and waits for the app to finish."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope = asgi_scope(request)
        messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        disconnected = asyncio.Event()
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            await messages.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)  # type: ignore[arg-type]
            finally:
                messages.put_nowait(None)

        task = asyncio.create_task(run())
        start = await messages.get()
        if start is None:
            await task  # raises what the app raised
            raise RuntimeError("the app returned without starting a response")
        return httpx.Response(
            start["status"],
            headers=start.get("headers", []),
            stream=_ASGIBodyStream(messages, disconnected, task),
        )


class _ASGIBodyStream(httpx.AsyncByteStream):
    def __init__(
        self,
        messages: asyncio.Queue[dict[str, Any] | None],
        disconnected: asyncio.Event,
        task: asyncio.Task[None],
    ) -> None:
        self._messages = messages
        self._disconnected = disconnected
        self._task = task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (message := await self._messages.get()) is not None:
            if message["type"] != "http.response.body":
                continue
            if message.get("body"):
                yield message["body"]
            if not message.get("more_body", False):
                return

    async def aclose(self) -> None:
        self._disconnected.set()
        await asyncio.wait_for(self._task, timeout=5)
