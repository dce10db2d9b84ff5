"""A bounded fuzz run: schemathesis generates requests from the gateway's own OpenAPI schema
(valid ones and ones that break it) against a served app (FakeBackend, the real Redis). No
request may get a server error, and every refusal is an OpenAI error body."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
import uvicorn
from fastapi import FastAPI
from hypothesis import HealthCheck, settings

from gateway.app import create_app
from gateway.backend.fake import FakeBackend
from gateway.config import Settings
from gateway.stack.triton_server import free_port
from tests.support.inprocess import ADMIN_KEY, AUTH, make_settings

# Two thousand requests: handed out with the long groups (tests/conftest.py).
pytestmark = pytest.mark.long

#: The fake model each route serves.
MODELS = {
    "/v1/embeddings": "fake-embed",
    "/v1/audio/speech": "fake-tts",
    "/v1/audio/transcriptions": "fake-stt",
    "/v1/audio/translations": "fake-stt",
}
#: Generated cases per operation (schemathesis adds its own boundary cases; most requests
#: are refused); the cases are the same every run
#: (``derandomize``): ``FUZZ_EXAMPLES=50`` for a deeper run.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "5"))


def _schema() -> dict[str, object]:
    """The OpenAPI schema of the app (building the app connects to nothing)."""
    offline = Settings(_env_file=None, redis_url="redis://127.0.0.1:1/0", admin_key=ADMIN_KEY)  # type: ignore[call-arg]
    return create_app(offline, backend=FakeBackend()).openapi()


@pytest.fixture(scope="module")
def api_schema() -> schemathesis.BaseSchema:
    """Loaded when the test runs: schemathesis builds its boundary cases as it loads, a few
    seconds that every worker would spend collecting the module if it were loaded there."""
    return schemathesis.openapi.from_dict(_schema())


#: One test, with a subtest per API operation (so one node id: xdist schedules it whole).
schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(scope="module")
def app(redis_server: object) -> FastAPI:
    models = ["fake-chat", "fake-plain", *MODELS.values()]
    return create_app(make_settings(models=models), backend=FakeBackend())


@pytest.fixture(scope="module")
def base_url(app: FastAPI) -> Iterator[str]:
    """The app under uvicorn in a thread, with every fake model."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the app did not start"
        time.sleep(0.02)
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,  # the same cases every run: a failure can be replayed
)
def test_no_request_gets_a_server_error(case: schemathesis.Case, base_url: str) -> None:
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        # A made-up model name stops at the 404; a served one lets the case go further.
        case.body["model"] = MODELS.get(case.path, "fake-chat")
    response = case.call(base_url=base_url, headers=AUTH, timeout=10)
    assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
    kind = response.headers.get("content-type", [""])[0]
    if response.status_code >= 400 and kind.startswith("application/json"):
        error = response.json()["error"]
        if case.path.startswith("/v1/messages"):  # Anthropic's routes, Anthropic's shape
            assert response.json()["type"] == "error", response.text
            assert set(error) == {"message", "type"}, response.text
        else:
            assert set(error) == {"message", "type", "param", "code"}, response.text


def test_the_fuzzed_app_still_serves_and_holds_no_redis_connection(
    app: FastAPI, base_url: str
) -> None:
    answer = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"model": "fake-chat", "messages": [{"role": "user", "content": "Hi"}]},
        headers=AUTH,
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    # A connection a request kept would be gone for good: enough of them stop the replica.
    # (The last request's usage may still be being recorded, just after its response.)
    pool = app.state.services.redis.connection_pool
    deadline = time.monotonic() + 5
    while pool._in_use_connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pool._in_use_connections, f"{len(pool._in_use_connections)} connections kept"
