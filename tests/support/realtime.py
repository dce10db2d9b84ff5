"""Realtime sessions over the WebSocket of Starlette's test client, on the fake backend: the
app with the voice models, the session's events up to one of a kind, what a session
answers to one client event (and the error it refuses one with), the client events tests
send, a key's usage once a connection is settled, and a stand-in for Silero VAD."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.backend.fake import FakeBackend
from tests.support.inprocess import AUTH, make_settings

#: The models of a Realtime session on the fake backend: chat, speech, transcription.
VOICE_MODELS = ["fake-chat", "fake-tts", "fake-stt"]


def realtime_app(fake: FakeBackend | None = None, **settings: Any) -> TestClient:
    """A test client of the app with :data:`VOICE_MODELS` (``settings``: more settings), to
    open sockets with in a ``with`` block."""
    app = create_app(make_settings(models=VOICE_MODELS, **settings), backend=fake or FakeBackend())
    return TestClient(app)


def create_key(client: TestClient, **spec: Any) -> dict[str, Any]:
    """A key made through the admin API of ``client``'s app (``spec``: its limits...)."""
    response = client.post("/admin/keys", json={"name": "rt", **spec}, headers=AUTH)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def events_until(socket: Any, *kinds: str) -> list[dict[str, Any]]:
    """Every server event up to and including the first of one of ``kinds``."""
    seen = []
    while True:
        event = json.loads(socket.receive_text())
        seen.append(event)
        if event["type"] in kinds:
            return seen


def answer(socket: Any, event: dict[str, Any]) -> list[dict[str, Any]]:
    """What the session sends while it handles ``event``: a retrieve of no item follows it,
    whose ``error`` ends the answer (so a test never waits for an event that never comes)."""
    socket.send_json(event)
    socket.send_json({"type": "conversation.item.retrieve", "item_id": "-", "event_id": "end"})
    seen = []
    while True:
        received = json.loads(socket.receive_text())
        if received["type"] == "error" and received["error"]["event_id"] == "end":
            return seen
        seen.append(received)


def refusal(socket: Any, event: dict[str, Any]) -> dict[str, Any]:
    """The ``error`` the session answers ``event`` with."""
    errors = [e["error"] for e in answer(socket, event) if e["type"] == "error"]
    assert errors, f"{event} was not refused"
    return errors[0]


def message(text: str, role: str = "user", **item: Any) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": role, "content": [{"type": kind, "text": text}]} | item,
    }


def say_hi(socket: Any) -> None:
    socket.send_json(message("Hi"))


def update(**session: Any) -> dict[str, Any]:
    return {"type": "session.update", "session": {"type": "realtime", **session}}


def recorded(client: TestClient, key_id: str, requests: int) -> bool:
    """Whether the key's usage comes to ``requests`` within a few seconds (a connection is
    settled just after it closes)."""
    deadline = time.monotonic() + 5
    while True:
        usage = client.get(f"/admin/keys/{key_id}/usage", headers=AUTH).json()
        if usage["requests"] >= requests or time.monotonic() > deadline:
            return bool(usage["requests"] == requests)
        time.sleep(0.02)


class LoudnessVAD:
    """Stands in for Silero VAD: a window is speech when it is loud (``tone``), else
    silence, so a test says exactly where the pauses are."""

    def __init__(self, rate: int) -> None:
        pass

    def process(self, window: memoryview) -> float:
        return 1.0 if np.abs(np.frombuffer(window, dtype=np.float32)).max() > 0.01 else 0.0

    def reset(self) -> None:
        pass
