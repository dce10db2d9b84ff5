"""The voice pieces on the fake backend: sentence cutting, spoken answers, and Realtime
sessions over a WebSocket (Starlette's test client, real Redis)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from gateway.app import create_app
from gateway.backend.fake import FakeBackend
from gateway.serving.voice import SentenceSplitter, SpokenAudio, TextDelta, Voice, spoken
from gateway.state.limits import Meter
from tests.unit.conftest import ADMIN_KEY, REPLY, make_settings


def test_sentences_are_cut_where_they_end() -> None:
    splitter = SentenceSplitter()
    pieces = [*splitter.feed("It costs 3.5 euros. Re"), *splitter.feed("ally? Yes!\nNext")]
    assert pieces == ["It costs 3.5 euros.", "Really?", "Yes!"]
    assert splitter.finish() == ["Next"]
    assert splitter.finish() == []


def test_a_long_clause_is_spoken_on_its_own() -> None:
    splitter = SentenceSplitter()
    text = "When the gateway hears a long first sentence, it speaks the clause, then the rest"
    assert splitter.feed(text) == [
        "When the gateway hears a long first sentence, it speaks the clause,"
    ]
    assert splitter.finish() == ["then the rest"]


async def words(text: str) -> AsyncGenerator[str, None]:
    """``text`` a word at a time, at a model's pace (10 ms a token)."""
    for word in text.split(" "):
        await asyncio.sleep(0.01)
        yield word + " "


async def test_text_streams_and_each_sentence_is_spoken() -> None:
    fake = FakeBackend()
    voice = Voice("fake-tts", "joe")
    meter = Meter()
    pieces = [p async for p in spoken(fake, voice, words("One two. Three."), "pcm", meter)]
    text = "".join(p.text for p in pieces if isinstance(p, TextDelta))
    assert text == "One two. Three. "
    audio = [p for p in pieces if isinstance(p, SpokenAudio) and p.seconds]
    assert [a.sentence for a in audio] == ["One two.", "Three."]
    # FakeBackend speaks 0.5 s per sentence, encoded as 24 kHz pcm16.
    assert meter.audio_seconds_out == pytest.approx(1.0)
    pcm = b"".join(p.data for p in pieces if isinstance(p, SpokenAudio))
    assert len(pcm) / 2 / 24_000 == pytest.approx(1.0, abs=0.01)
    assert [call[1] for call in fake.speech_calls] == ["One two.", "Three."]
    # The first sentence's audio comes before the last words of the text.
    first_audio = pieces.index(audio[0])
    assert first_audio < max(i for i, p in enumerate(pieces) if isinstance(p, TextDelta))


async def test_closing_a_spoken_answer_stops_generating() -> None:
    fake = FakeBackend()
    produced: list[str] = []

    async def endless() -> AsyncGenerator[str, None]:
        while True:
            await asyncio.sleep(0.001)
            produced.append("x")
            yield "Word. "

    stream = spoken(fake, Voice("fake-tts", "joe"), endless(), "pcm", Meter())
    assert isinstance(await anext(stream), TextDelta)
    await stream.aclose()
    count = len(produced)
    await asyncio.sleep(0.05)
    assert len(produced) == count


@pytest.fixture
def realtime() -> Iterator[TestClient]:
    app = create_app(
        make_settings(models=["fake-chat", "fake-tts", "fake-stt"]), backend=FakeBackend()
    )
    with TestClient(app) as client:
        yield client


def until(socket: Any, kind: str) -> list[dict[str, Any]]:
    seen = []
    while True:
        event = json.loads(socket.receive_text())
        seen.append(event)
        if event["type"] == kind:
            return seen


AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


def say_hi(socket: Any) -> None:
    socket.send_json(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            },
        }
    )


def test_a_text_turn_answers_with_the_model_reply(realtime: TestClient) -> None:
    with realtime.websocket_connect("/v1/realtime?model=fake-chat", headers=AUTH) as socket:
        created = until(socket, "session.created")[-1]["session"]
        assert created["model"] == "fake-chat"
        assert created["audio"]["output"]["voice"] == "joe"
        say_hi(socket)
        added = until(socket, "conversation.item.done")
        assert added[0]["type"] == "conversation.item.added"
        socket.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        events = until(socket, "response.done")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == REPLY
    assert events[-1]["response"]["status"] == "completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == REPLY


def test_truncate_keeps_the_sentences_heard(realtime: TestClient) -> None:
    with realtime.websocket_connect("/v1/realtime", headers=AUTH) as socket:
        until(socket, "session.created")
        say_hi(socket)
        socket.send_json({"type": "response.create"})
        events = until(socket, "response.done")
        item = events[-1]["response"]["output"][0]
        pcm = b"".join(
            base64.b64decode(e["delta"])
            for e in events
            if e["type"] == "response.output_audio.delta"
        )
        # FakeBackend speaks 0.5 s per sentence; REPLY has two sentences? it has one.
        assert len(pcm) / 2 / 24_000 == pytest.approx(0.5, abs=0.05)
        socket.send_json(
            {
                "type": "conversation.item.truncate",
                "item_id": item["id"],
                "content_index": 0,
                "audio_end_ms": 0,
            }
        )
        truncated = until(socket, "conversation.item.truncated")[-1]
        assert truncated["audio_end_ms"] == 0
        socket.send_json({"type": "conversation.item.retrieve", "item_id": item["id"]})
        retrieved = until(socket, "conversation.item.retrieved")[-1]["item"]
        assert retrieved["content"][0]["transcript"] == ""


def test_manual_commit_transcribes_the_buffer(realtime: TestClient) -> None:
    with realtime.websocket_connect("/v1/realtime", headers=AUTH) as socket:
        until(socket, "session.created")
        socket.send_json(
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}
        )
        updated = until(socket, "session.updated")[-1]["session"]
        assert updated["audio"]["input"]["turn_detection"] is None
        tone = (np.sin(np.arange(24_000) / 10) * 3000).astype("<i2").tobytes()  # 1 s
        socket.send_json(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(tone).decode()}
        )
        socket.send_json({"type": "input_audio_buffer.commit"})
        events = until(socket, "conversation.item.done")
        kinds = [e["type"] for e in events]
        assert kinds.index("input_audio_buffer.committed") < kinds.index(
            "conversation.item.input_audio_transcription.completed"
        )
        done = events[-1]["item"]
        assert done["content"][0]["transcript"] == "Segment 1 says hello."
        # No VAD: nothing answers until asked.
        socket.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        assert until(socket, "response.done")[-1]["response"]["status"] == "completed"


def test_the_key_is_checked_before_the_upgrade(realtime: TestClient) -> None:
    with pytest.raises(WebSocketDisconnect), realtime.websocket_connect("/v1/realtime"):
        pass
    protocols = ["realtime", f"openai-insecure-api-key.{ADMIN_KEY}"]
    with realtime.websocket_connect("/v1/realtime", subprotocols=protocols) as socket:
        assert socket.accepted_subprotocol == "realtime"
        assert until(socket, "session.created")


def test_an_unknown_model_is_refused(realtime: TestClient) -> None:
    with (
        pytest.raises(WebSocketDisconnect),
        realtime.websocket_connect("/v1/realtime?model=nope", headers=AUTH),
    ):
        pass
