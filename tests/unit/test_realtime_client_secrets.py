"""Realtime client secrets (``POST /v1/realtime/client_secrets``, then ``/v1/realtime`` with
the ``ek_`` secret) on the fake backend and a real Redis: created as the official SDK
creates them, one session each with the configuration they were created with, under the
creating key's models and limits, refused everywhere else."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import redis
from starlette.testclient import TestClient, WebSocketDenialResponse

from gateway.backend.fake import FakeBackend
from gateway.state.client_secrets import ONLY_REALTIME
from gateway.state.keys import hash_key
from tests.support import inprocess
from tests.support.inprocess import ADMIN_KEY, AUTH, REPLY, bearer
from tests.support.realtime import (
    VOICE_MODELS,
    create_key,
    events_until,
    message,
    realtime_app,
    recorded,
)

PIRATE = "Answer like a pirate."
TEXT_SESSION: dict[str, Any] = {
    "type": "realtime",
    "instructions": PIRATE,
    "output_modalities": ["text"],
    "audio": {"input": {"turn_detection": None}},
}


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def gateway(fake: FakeBackend) -> Iterator[TestClient]:
    with realtime_app(fake) as client:
        yield client


def sdk(client: TestClient, key: str = ADMIN_KEY) -> openai.OpenAI:
    """The official SDK over the app, sending ``key``."""
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0
    )


def browser(secret: str) -> list[str]:
    """The subprotocols a browser opens the WebSocket with."""
    return ["realtime", f"openai-insecure-api-key.{secret}"]


def refused(client: TestClient, url: str = "/v1/realtime", **connect: Any) -> Any:
    """The HTTP answer that refused the upgrade."""
    with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect(url, **connect):
        pass
    return denied.value


def mint(client: TestClient, key: str = ADMIN_KEY, **body: Any) -> Any:
    return client.post("/v1/realtime/client_secrets", json=body, headers=bearer(key))


def test_a_secret_opens_one_session_configured_as_it_was_created(
    gateway: TestClient, fake: FakeBackend
) -> None:
    created = sdk(gateway).realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 120}, session=TEXT_SESSION
    )
    assert created.value.startswith("ek_") and ADMIN_KEY not in created.value
    assert abs(created.expires_at - (time.time() + 120)) < 5
    assert created.session.type == "realtime"
    assert created.session.instructions == PIRATE
    assert created.session.model == "fake-chat"
    with gateway.websocket_connect("/v1/realtime", subprotocols=browser(created.value)) as socket:
        assert socket.accepted_subprotocol == "realtime"
        session = events_until(socket, "session.created")[-1]["session"]
        assert session["instructions"] == PIRATE
        assert session["output_modalities"] == ["text"]
        assert session["audio"]["input"]["turn_detection"] is None
        socket.send_json(message("Hi"))
        socket.send_json({"type": "response.create"})
        events = events_until(socket, "response.done")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == REPLY
    assert PIRATE in fake.calls[-1].prompt  # the model got the secret's instructions
    # One session per secret: the second use is refused before the upgrade.
    again = refused(gateway, subprotocols=browser(created.value))
    assert again.status_code == 401
    assert "already used" in again.json()["error"]["message"]


def test_the_authorization_header_opens_it_too_and_model_must_match(gateway: TestClient) -> None:
    value = mint(gateway, session={"type": "realtime", "model": "fake-chat"}).json()["value"]
    # Another model in the URL is refused before the upgrade...
    wrong = refused(gateway, "/v1/realtime?model=fake-plain", headers=bearer(value))
    assert wrong.status_code == 400
    assert (wrong.json()["error"]["param"], wrong.json()["error"]["code"]) == (
        "model",
        "invalid_value",
    )
    # ... and so is the beta interface; neither used the secret up: it is taken once the
    # session is open, every check passed.
    beta = refused(gateway, headers={**bearer(value), "OpenAI-Beta": "realtime=v1"})
    assert beta.json()["error"]["code"] == "unsupported_interface"
    with gateway.websocket_connect("/v1/realtime?model=fake-chat", headers=bearer(value)) as socket:
        assert events_until(socket, "session.created")[-1]["session"]["model"] == "fake-chat"
    assert refused(gateway, headers=bearer(value)).status_code == 401


def test_a_transcription_session_has_its_secret(gateway: TestClient, fake: FakeBackend) -> None:
    spec = {"type": "transcription", "audio": {"input": {"transcription": {"model": "fake-stt"}}}}
    created = mint(gateway, session=spec)
    assert created.status_code == 200, created.text
    assert created.json()["session"]["type"] == "transcription"
    with gateway.websocket_connect("/v1/realtime", headers=bearer(created.json()["value"])) as ws:
        session = events_until(ws, "session.created")[-1]["session"]
        assert session["object"] == "realtime.transcription_session"
        ws.send_json({"type": "response.create"})
        assert events_until(ws, "error")[-1]["error"]["code"] == "invalid_event"
    # Without transcription events too (its session shows no transcription model).
    quiet = {"type": "transcription", "audio": {"input": {"transcription": None}}}
    assert mint(gateway, session=quiet).status_code == 200


def test_an_expired_secret_is_refused(gateway: TestClient) -> None:
    value = mint(gateway, expires_after={"seconds": 10}).json()["value"]
    assert inprocess.REDIS is not None
    store = redis.Redis.from_url(inprocess.REDIS.url)
    record = f"gw:client_secret:{hash_key(value)}"
    assert 9 <= store.ttl(record) <= 10  # Redis drops it when expires_after has passed
    store.pexpire(record, 1)  # as if the 10 s had passed
    time.sleep(0.01)
    expired = refused(gateway, headers=bearer(value))
    assert expired.status_code == 401
    assert expired.json()["error"]["code"] == "invalid_api_key"
    assert "expired" in expired.json()["error"]["message"]


def test_a_secret_is_refused_everywhere_but_the_realtime_websocket(gateway: TestClient) -> None:
    value = mint(gateway).json()["value"]
    with_secret = sdk(gateway, value)
    with pytest.raises(openai.AuthenticationError) as models:
        with_secret.models.list()
    assert models.value.body["message"] == ONLY_REALTIME  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        with_secret.chat.completions.create(
            model="fake-chat", messages=[{"role": "user", "content": "Hi"}]
        )
    with pytest.raises(openai.AuthenticationError):  # no secret makes another
        with_secret.realtime.client_secrets.create()
    admin = gateway.get("/admin/keys", headers=bearer(value))
    assert admin.status_code == 401 and admin.json()["error"]["message"] == ONLY_REALTIME
    # None of that used it up.
    with gateway.websocket_connect("/v1/realtime", headers=bearer(value)) as socket:
        assert events_until(socket, "session.created")


def test_the_creating_keys_models_apply() -> None:
    with realtime_app() as client:
        # A key that may not use the speech model cannot create a spoken session...
        chat_only = create_key(client, models=["fake-chat", "fake-stt"])["key"]
        spoken = mint(client, chat_only)
        assert spoken.status_code == 403
        assert spoken.json()["error"]["code"] == "model_not_allowed"
        # ... nor name a chat model it may not use; a text session of its models is fine.
        answer = mint(client, chat_only, session={**TEXT_SESSION, "model": "fake-plain"})
        assert answer.status_code == 403
        assert answer.json()["error"]["param"] == "session.model"
        assert mint(client, chat_only, session=TEXT_SESSION).status_code == 200


def test_a_refused_field_is_named_and_nothing_is_created(gateway: TestClient) -> None:
    cases = [
        ({"session": {"type": "realtime", "bogus": 1}}, "session.bogus"),
        (
            {"session": {"type": "realtime", "audio": {"output": {"speed": 9}}}},
            "session.audio.output.speed",
        ),
        ({"session": {"type": "realtime", "model": "nope"}}, "session.model"),
        ({"expires_after": {"seconds": 5}}, "expires_after.seconds"),
        ({"expires_after": {"seconds": 7201}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "now"}}, "expires_after.anchor"),
        ({"model": "fake-chat"}, "model"),
    ]
    for body, param in cases:
        answer = mint(gateway, **body)
        assert answer.status_code in (400, 404), (body, answer.text)
        error = answer.json()["error"]
        assert error["param"] == param and error["code"], (body, error)
    assert "Unrecognized request argument supplied: model" in answer.json()["error"]["message"]
    assert gateway.get("/v1/me", headers=AUTH).json()["storage"]["key"]["used_bytes"] == 0


def test_the_session_is_the_creating_keys_request() -> None:
    with realtime_app() as client:
        created = create_key(client, max_concurrency=1, models=VOICE_MODELS)
        key, key_id = created["key"], created["id"]
        value = mint(client, key, session=TEXT_SESSION).json()["value"]
        stored = client.get("/v1/me", headers=bearer(key)).json()["storage"]["key"]["used_bytes"]
        assert stored > 512  # the record counts in the key's stored bytes until it is used
        with client.websocket_connect("/v1/realtime", headers=bearer(key)) as socket:
            events_until(socket, "session.created")
            # The key's one slot is taken: the secret is refused as the key would be, and
            # stays usable.
            busy = refused(client, subprotocols=browser(value))
            assert busy.status_code == 429
        with client.websocket_connect("/v1/realtime", subprotocols=browser(value)) as socket:
            events_until(socket, "session.created")
            socket.send_json(message("Hi"))
            socket.send_json({"type": "response.create"})
            assert events_until(socket, "response.done")[-1]["response"]["status"] == "completed"
        me = client.get("/v1/me", headers=bearer(key)).json()
        assert me["storage"]["key"]["used_bytes"] == 0
        # The key's requests: the creation, its own session, the secret's session and its
        # response, and the two /v1/me (the refused connection was not let in).
        assert recorded(client, key_id, 6)
        text = client.get("/metrics").text
    assert 'route="/v1/realtime/client_secrets",status="200"} 1.0' in text


def test_a_key_revoked_since_refuses_its_secrets(gateway: TestClient) -> None:
    created = create_key(gateway, models=VOICE_MODELS)
    value = mint(gateway, created["key"]).json()["value"]
    assert gateway.delete(f"/admin/keys/{created['id']}", headers=AUTH).status_code == 200
    revoked = refused(gateway, headers=bearer(value))
    assert revoked.status_code == 401
    assert "revoked" in revoked.json()["error"]["message"]
