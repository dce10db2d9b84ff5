"""Realtime sessions over a WebSocket (Starlette's test client) on the fake backend and a real
Redis: the conversation, the models a key may use, the bounds on what a client can make a
session hold, and every client field honoured or refused by name."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
from fastapi import FastAPI
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from gateway.app import create_app
from gateway.backend.base import ModelInfo
from gateway.backend.fake import FakeBackend
from gateway.stack.redis_server import EmbeddedRedis
from gateway.state.budgets import counters_key
from tests.support.inprocess import ADMIN_KEY, AUTH, REPLY, bearer, make_settings
from tests.support.realtime import (
    VOICE_MODELS,
    LoudnessVAD,
    answer,
    create_key,
    events_until,
    message,
    realtime_app,
    recorded,
    refusal,
    say_hi,
    update,
)

PCM_RATE = 24_000


@pytest.fixture
def realtime() -> Iterator[TestClient]:
    with realtime_app() as client:
        yield client


def tone(seconds: float) -> str:
    """``seconds`` of a 24 kHz pcm16 tone, in base64 (the fake transcribes each started
    second as "Segment N says hello.")."""
    samples = np.sin(np.arange(int(PCM_RATE * seconds)) / 10) * 3000
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


def silence(seconds: float) -> str:
    return base64.b64encode(bytes(int(PCM_RATE * seconds) * 2)).decode()


def no_vad() -> dict[str, Any]:
    return update(audio={"input": {"turn_detection": None}})


# --- the conversation -------------------------------------------------------------------


def test_a_text_turn_answers_with_the_model_reply(realtime: TestClient) -> None:
    with realtime.websocket_connect("/v1/realtime?model=fake-chat", headers=AUTH) as socket:
        created = events_until(socket, "session.created")[-1]["session"]
        assert created["model"] == "fake-chat"
        assert created["audio"]["output"]["voice"] == "joe"
        say_hi(socket)
        added = events_until(socket, "conversation.item.done")
        assert added[0]["type"] == "conversation.item.added"
        socket.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        events = events_until(socket, "response.done")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == REPLY
    assert events[-1]["response"]["status"] == "completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == REPLY


def test_truncate_keeps_the_sentences_heard(realtime: TestClient) -> None:
    with realtime.websocket_connect("/v1/realtime", headers=AUTH) as socket:
        events_until(socket, "session.created")
        say_hi(socket)
        socket.send_json({"type": "response.create"})
        events = events_until(socket, "response.done")
        item = events[-1]["response"]["output"][0]
        pcm = b"".join(
            base64.b64decode(e["delta"])
            for e in events
            if e["type"] == "response.output_audio.delta"
        )
        # FakeBackend speaks 0.5 s per sentence, and REPLY is one sentence.
        assert len(pcm) / 2 / 24_000 == pytest.approx(0.5, abs=0.05)
        socket.send_json(
            {
                "type": "conversation.item.truncate",
                "item_id": item["id"],
                "content_index": 0,
                "audio_end_ms": 0,
            }
        )
        truncated = events_until(socket, "conversation.item.truncated")[-1]
        assert truncated["audio_end_ms"] == 0
        socket.send_json({"type": "conversation.item.retrieve", "item_id": item["id"]})
        retrieved = events_until(socket, "conversation.item.retrieved")[-1]["item"]
        assert retrieved["content"][0]["transcript"] == ""


def test_manual_commit_transcribes_the_buffer(realtime: TestClient) -> None:
    with realtime.websocket_connect("/v1/realtime", headers=AUTH) as socket:
        events_until(socket, "session.created")
        socket.send_json(no_vad())
        updated = events_until(socket, "session.updated")[-1]["session"]
        assert updated["audio"]["input"]["turn_detection"] is None
        socket.send_json({"type": "input_audio_buffer.append", "audio": tone(1.0)})
        socket.send_json({"type": "input_audio_buffer.commit"})
        events = events_until(socket, "conversation.item.done")
        kinds = [e["type"] for e in events]
        assert kinds.index("input_audio_buffer.committed") < kinds.index(
            "conversation.item.input_audio_transcription.completed"
        )
        done = events[-1]["item"]
        assert done["content"][0]["transcript"] == "Segment 1 says hello."
        # No VAD: nothing answers until asked.
        socket.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        assert events_until(socket, "response.done")[-1]["response"]["status"] == "completed"


def test_the_key_is_checked_before_the_upgrade(realtime: TestClient) -> None:
    with pytest.raises(WebSocketDisconnect), realtime.websocket_connect("/v1/realtime"):
        pass
    protocols = ["realtime", f"openai-insecure-api-key.{ADMIN_KEY}"]
    with realtime.websocket_connect("/v1/realtime", subprotocols=protocols) as socket:
        assert socket.accepted_subprotocol == "realtime"
        assert events_until(socket, "session.created")


def test_an_unknown_model_is_refused(realtime: TestClient) -> None:
    with (
        pytest.raises(WebSocketDisconnect),
        realtime.websocket_connect("/v1/realtime?model=nope", headers=AUTH),
    ):
        pass


# --- models checked against the key -----------------------------------------------------


def test_a_session_needs_a_key_that_may_use_its_voice_models(realtime: TestClient) -> None:
    # Spoken answers use fake-tts (and transcribed audio fake-stt), not only fake-chat.
    key = create_key(realtime, models=["fake-chat", "fake-stt"])["key"]
    with (
        pytest.raises(WebSocketDenialResponse) as refused,
        realtime.websocket_connect("/v1/realtime?model=fake-chat", headers=bearer(key)),
    ):
        pass
    assert refused.value.status_code == 403
    error = refused.value.json()["error"]
    assert error["code"] == "model_not_allowed" and "fake-tts" in error["message"]


def test_session_update_cannot_switch_to_a_model_the_key_may_not_use() -> None:
    fake = FakeBackend()
    fake.model_list.append(ModelInfo("fake-stt-2", "transcription", True, languages=("en",)))
    with realtime_app(fake) as client:
        key = create_key(client, models=VOICE_MODELS)["key"]
        with client.websocket_connect("/v1/realtime", headers=bearer(key)) as socket:
            events_until(socket, "session.created")
            error = refusal(socket, update(model="fake-plain", instructions="Changed."))
            assert (error["code"], error["param"]) == ("model_not_allowed", "session.model")
            transcription = {"transcription": {"model": "fake-stt-2"}}
            error = refusal(socket, update(audio={"input": transcription}))
            assert error["code"] == "model_not_allowed"
            assert error["param"] == "session.audio.input.transcription.model"
            # The session kept its settings, all of them: the refused update changed nothing.
            socket.send_json(update())
            kept = events_until(socket, "session.updated")[-1]["session"]
            assert kept["model"] == "fake-chat"
            assert kept["instructions"] != "Changed."
            assert kept["audio"]["input"]["transcription"]["model"] == "fake-stt"
            say_hi(socket)
            socket.send_json({"type": "response.create"})
            assert events_until(socket, "response.done")[-1]["response"]["status"] == "completed"
    assert {call.model for call in fake.calls} == {"fake-chat"}


def test_the_transcription_model_of_the_session_is_used() -> None:
    fake = FakeBackend()
    fake.model_list.append(ModelInfo("fake-stt-2", "transcription", True, languages=("en",)))
    with (
        realtime_app(fake) as client,
        client.websocket_connect("/v1/realtime", headers=AUTH) as socket,
    ):
        events_until(socket, "session.created")
        transcription = {"model": "fake-stt-2", "language": "en"}
        socket.send_json(
            update(audio={"input": {"turn_detection": None, "transcription": transcription}})
        )
        session = events_until(socket, "session.updated")[-1]["session"]
        assert session["audio"]["input"]["transcription"]["model"] == "fake-stt-2"
        socket.send_json({"type": "input_audio_buffer.append", "audio": tone(0.5)})
        socket.send_json({"type": "input_audio_buffer.commit"})
        events_until(socket, "conversation.item.done")
        # An OpenAI name keeps the session's model (the Agents SDK sends one in every
        # update); one of ours changes it.
        socket.send_json(update(audio={"input": {"transcription": {"model": "whisper-1"}}}))
        session = events_until(socket, "session.updated")[-1]["session"]
        assert session["audio"]["input"]["transcription"]["model"] == "fake-stt-2"
        socket.send_json(update(audio={"input": {"transcription": {"model": "fake-stt"}}}))
        session = events_until(socket, "session.updated")[-1]["session"]
        assert session["audio"]["input"]["transcription"]["model"] == "fake-stt"
    assert fake.transcribe_calls[0][0] == "fake-stt-2"
    assert fake.transcribe_calls[0][2].language == "en"


# --- transcriptions are requests under the key's limits ---------------------------------


def test_a_transcription_is_a_request_under_the_keys_rpm(realtime: TestClient) -> None:
    created = create_key(realtime, rpm=2)
    with realtime.websocket_connect("/v1/realtime", headers=bearer(created["key"])) as socket:
        events_until(socket, "session.created")  # the session: one request
        socket.send_json(no_vad())
        events_until(socket, "session.updated")
        socket.send_json({"type": "input_audio_buffer.append", "audio": tone(1.0)})
        socket.send_json({"type": "input_audio_buffer.commit"})
        transcribed = events_until(socket, "conversation.item.done")  # the transcription: another
        assert transcribed[-2]["type"] == "conversation.item.input_audio_transcription.completed"
        # It is recorded as soon as it is done (the session's own request when it closes).
        usage = realtime.get(f"/admin/keys/{created['id']}/usage", headers=AUTH).json()
        assert usage["requests"] == 1
        assert usage["audio_seconds_in"] == pytest.approx(1.0, abs=0.01)
        socket.send_json({"type": "response.create"})
        refused = events_until(socket, "error", "response.done")[-1]
        assert refused["type"] == "error"
        assert refused["error"]["code"] == "rate_limit_exceeded"
        # A transcription refused in turn says so, and the conversation goes on.
        socket.send_json({"type": "input_audio_buffer.append", "audio": tone(1.0)})
        socket.send_json({"type": "input_audio_buffer.commit"})
        failed = events_until(socket, "conversation.item.done")[-2]
        assert failed["type"] == "conversation.item.input_audio_transcription.failed"
        assert failed["error"]["code"] == "rate_limit_exceeded"


def test_a_spent_budget_refuses_the_sessions_transcriptions_and_responses(
    realtime: TestClient, redis_server: EmbeddedRedis
) -> None:
    created = create_key(realtime, budget={"tokens_per_day": 1000})
    today = int(time.time() // 86400)  # the day Redis's clock counts in (UTC)
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as store:
        spent = {"day": today, "day_tokens": 1000}  # spent to the token (docs/budgets.md)
        store.hset(counters_key("key", created["id"]), mapping=spent)
    with realtime.websocket_connect("/v1/realtime", headers=bearer(created["key"])) as socket:
        events_until(socket, "session.created")
        socket.send_json(no_vad())
        events_until(socket, "session.updated")
        socket.send_json({"type": "input_audio_buffer.append", "audio": tone(1.0)})
        socket.send_json({"type": "input_audio_buffer.commit"})
        failed = events_until(socket, "conversation.item.done")[-2]
        assert failed["type"] == "conversation.item.input_audio_transcription.failed"
        assert failed["error"]["code"] == "budget_exceeded"
        text = {"type": "input_text", "text": "hi"}
        item = {"type": "message", "role": "user", "content": [text]}
        socket.send_json({"type": "conversation.item.create", "item": item})
        events_until(socket, "conversation.item.added")
        socket.send_json({"type": "response.create"})
        refused = events_until(socket, "error", "response.done")[-1]
        assert refused["type"] == "error"
        assert refused["error"]["code"] == "budget_exceeded"


# --- the connection: admitted, counted and settled like any /v1 request -------------------


def test_a_session_holds_its_keys_concurrency_slot_until_it_closes() -> None:
    app = create_app(make_settings(models=VOICE_MODELS), backend=FakeBackend())
    with TestClient(app) as client:
        created = create_key(client, max_concurrency=1)
        with client.websocket_connect("/v1/realtime", headers=bearer(created["key"])) as socket:
            events_until(socket, "session.created")
            with (
                pytest.raises(WebSocketDenialResponse) as refused,
                client.websocket_connect("/v1/realtime", headers=bearer(created["key"])),
            ):
                pass
            assert refused.value.status_code == 429
            assert refused.value.headers["retry-after"] == "1"
            assert refused.value.json()["error"]["code"] == "rate_limit_exceeded"
        # Closed: it was one request in the key's usage, and its slot is free again.
        assert recorded(client, created["id"], 1)
        with client.websocket_connect("/v1/realtime", headers=bearer(created["key"])) as socket:
            events_until(socket, "session.created")
        assert recorded(client, created["id"], 2)
        text = client.get("/metrics").text
    assert 'model="fake-chat",route="/v1/realtime",status="101"} 2.0' in text
    assert 'model="",route="/v1/realtime",status="429"} 1.0' in text
    assert 'gateway_rate_limited_total{limit="concurrency"} 1.0' in text
    assert "gateway_realtime_sessions 0.0" in text


def test_a_draining_gateway_refuses_new_sessions() -> None:
    app = create_app(make_settings(models=VOICE_MODELS), backend=FakeBackend())
    with TestClient(app) as client:
        app.state.drain.draining = True
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect("/v1/realtime", headers=AUTH),
        ):
            pass
    assert refused.value.status_code == 503
    assert refused.value.headers["retry-after"] == "1"
    assert refused.value.json()["error"]["code"] == "shutting_down"


async def test_a_refusal_is_a_close_under_a_server_without_denial_responses(app: FastAPI) -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "scheme": "ws",
        "path": "/v1/realtime",
        "raw_path": b"/v1/realtime",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "subprotocols": ["realtime"],
        "extensions": {},  # no websocket.http.response
    }
    await app(scope, receive, send)
    assert [m["type"] for m in sent] == ["websocket.close"]
    assert sent[0]["code"] == 1008
    assert sent[0]["reason"].startswith("You didn't provide an API key.")


# --- turns spoken with pauses -----------------------------------------------------------


def test_a_turn_with_many_pauses_costs_and_bills_a_few_times_its_audio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At a pause (200 ms of quiet, less than the 500 ms that end the turn) the turn so far
    is transcribed ahead, from its start (Whisper hears all of it, as at the end). A pause
    goes unguessed where the turn's guesses would send the model more than 3 times its
    audio, so the work grows with the turn, not its square (transcribing at every pause
    sent 101 s for this 16 s turn), and the key is billed what the model transcribed."""
    from gateway.serving import vad

    monkeypatch.setattr(vad, "SileroVAD", LoudnessVAD)
    fake = FakeBackend()
    with realtime_app(fake) as client:
        created = create_key(client)
        with client.websocket_connect("/v1/realtime", headers=bearer(created["key"])) as socket:
            events_until(socket, "session.created")
            detection = {"type": "server_vad", "create_response": False}
            socket.send_json(update(audio={"input": {"turn_detection": detection}}))
            events_until(socket, "session.updated")
            for pause in range(12):
                socket.send_json({"type": "input_audio_buffer.append", "audio": tone(1.0)})
                for _ in range(3):  # 300 ms of quiet: a guess, not the end of the turn
                    socket.send_json({"type": "input_audio_buffer.append", "audio": silence(0.1)})
                # Handled in order: the guess (if any) reached the model before the speaker
                # goes on (the first waits for its request to be admitted).
                answer(socket, {"type": "conversation.item.retrieve", "item_id": "-"})
                deadline = time.monotonic() + 10
                while pause == 0 and not fake.transcribe_calls:
                    assert time.monotonic() < deadline, "the first pause was not guessed at"
                    time.sleep(0.01)
            for _ in range(10):
                socket.send_json({"type": "input_audio_buffer.append", "audio": silence(0.1)})
            done = events_until(socket, "conversation.item.input_audio_transcription.completed")[-1]
        usage = client.get(f"/admin/keys/{created['id']}/usage", headers=AUTH).json()
    turn_s = 12 * 1.3  # what was spoken and paused, before the silence that ended it
    heard = [call[1].size / 16_000 for call in fake.transcribe_calls]
    assert len(heard) >= 5  # the early pauses are guessed at
    assert sum(heard) <= 4 * turn_s + 1, heard  # 3 times in guesses, and the end's
    # What the model transcribed is what the key is billed, and what the event says.
    assert done["usage"]["seconds"] == pytest.approx(sum(heard), abs=0.01)
    assert usage["audio_seconds_in"] == pytest.approx(sum(heard), abs=0.01)
    assert done["transcript"].startswith("Segment 1 says hello.")


# --- bounds -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bound", "code"),
    [
        ({"realtime_max_buffer_mb": 0.07}, "input_audio_buffer_full"),  # 1.5 s of pcm16
        ({"max_audio_seconds": 1.5}, "audio_too_long"),
    ],
)
def test_the_input_buffer_is_bounded(bound: dict[str, float], code: str) -> None:
    with (
        realtime_app(**bound) as client,
        client.websocket_connect("/v1/realtime", headers=AUTH) as socket,
    ):
        events_until(socket, "session.created")
        # With the VAD on, silence is forgotten as it is judged: an open microphone never
        # fills the buffer.
        append = {"type": "input_audio_buffer.append", "audio": silence(0.1)}
        for _ in range(40):
            assert not [e for e in answer(socket, append) if e["type"] == "error"]
        socket.send_json(no_vad())
        events_until(socket, "session.updated")
        socket.send_json({"type": "input_audio_buffer.clear"})
        events_until(socket, "input_audio_buffer.cleared")
        socket.send_json({"type": "input_audio_buffer.append", "audio": tone(1.0)})
        error = refusal(socket, {"type": "input_audio_buffer.append", "audio": tone(1.0)})
        assert (error["code"], error["param"]) == (code, "audio")
        # The buffer is as it was before the refused append: one second.
        socket.send_json({"type": "input_audio_buffer.commit"})
        done = events_until(socket, "conversation.item.done")[-1]["item"]
        assert done["content"][0]["transcript"] == "Segment 1 says hello."


def test_an_items_audio_is_bounded() -> None:
    with (
        realtime_app(max_audio_seconds=1.5) as client,
        client.websocket_connect("/v1/realtime", headers=AUTH) as socket,
    ):
        events_until(socket, "session.created")
        content = [{"type": "input_text", "text": "Listen:"}, {"type": "input_audio"}]
        item = {"type": "message", "role": "user", "content": content}
        content[1]["audio"] = tone(2.0)
        error = refusal(socket, {"type": "conversation.item.create", "item": item})
        assert (error["code"], error["param"]) == ("audio_too_long", "item.content[1].audio")
        content[1]["audio"] = tone(1.0)
        socket.send_json({"type": "conversation.item.create", "item": item})
        done = events_until(socket, "conversation.item.done")[-1]["item"]
        # The transcript goes into the audio part, wherever it is.
        assert done["content"][1]["transcript"] == "Segment 1 says hello."


def test_the_oldest_items_are_dropped_past_the_bounds() -> None:
    with (
        realtime_app(realtime_max_items=3, max_stored_kb=1) as client,
        client.websocket_connect("/v1/realtime", headers=AUTH) as socket,
    ):
        events_until(socket, "session.created")
        ids, events = [], []
        for text in ("one", "two", "three", "four", "x" * 600, "y" * 600):
            socket.send_json(message(text))
            events += events_until(socket, "conversation.item.done")
            ids.append(events[-1]["item"]["id"])
        events += answer(socket, {"type": "conversation.item.retrieve", "item_id": ids[5]})
        dropped = [e["item_id"] for e in events if e["type"] == "conversation.item.deleted"]
        # Three items at most, and 1 KB of text: the second item of 600 bytes pushes out
        # every other.
        assert dropped == ids[:5]
        assert events[-1]["type"] == "conversation.item.retrieved"
        # What one item or the instructions may hold is bounded by the same setting.
        error = refusal(socket, message("z" * 2000))
        assert (error["code"], error["param"]) == ("string_above_max_length", "item.content")
        error = refusal(socket, update(instructions="z" * 2000))
        assert error["param"] == "session.instructions"


def test_deep_or_broken_json_events_get_an_error_and_the_session_goes_on(
    realtime: TestClient,
) -> None:
    with realtime.websocket_connect("/v1/realtime", headers=AUTH) as socket:
        events_until(socket, "session.created")
        # 5,000 levels made the parser raise RecursionError, which ended the session.
        deep = '{"type": "session.update", "session": {"metadata": ' + "[" * 5000 + "]" * 5000
        socket.send_text(deep + "}}")
        error = events_until(socket, "error")[-1]["error"]
        assert error["code"] == "json_too_deep"
        assert "at most 128" in error["message"] and "GATEWAY_MAX_JSON_DEPTH" in error["message"]
        # 40,000 objects in one event (16 MB could hold millions): measured, not parsed.
        many = ",".join(["{}"] * 40_000)
        socket.send_text(
            '{"type": "conversation.item.create", "item": {"type": "message", "role": "user", '
            f'"content": [{many}]}}}}'
        )
        error = events_until(socket, "error")[-1]["error"]
        assert error["code"] == "json_too_complex"
        assert "GATEWAY_MAX_JSON_CONTAINERS" in error["message"]
        socket.send_text('{"type": "session.update", "session": }')
        error = events_until(socket, "error")[-1]["error"]
        # Where it broke, in the gateway's words (not Python's "Expecting value: ...").
        assert (error["code"], error["message"]) == (
            "invalid_json",
            "The event is not valid JSON (line 1, column 39).",
        )
        # A lone surrogate escape would make instructions nothing can encode into a prompt.
        socket.send_text('{"type": "session.update", "session": {"instructions": "\\ud800"}}')
        error = events_until(socket, "error")[-1]["error"]
        assert error["code"] == "invalid_json" and "surrogate" in error["message"]
        say_hi(socket)
        assert events_until(socket, "conversation.item.done")[-1]["item"]["status"] == "completed"


def test_queued_work_is_bounded() -> None:
    fake = FakeBackend(token_delay_s=0.05)
    with (
        realtime_app(fake) as client,
        client.websocket_connect("/v1/realtime", headers=AUTH) as socket,
    ):
        events_until(socket, "session.created")
        say_hi(socket)
        events_until(socket, "conversation.item.done")
        create = {"type": "response.create", "response": {"conversation": "none"}}
        events = [e for _ in range(20) for e in answer(socket, create)]
        errors = [e["error"]["code"] for e in events if e["type"] == "error"]
        assert "too_many_pending_jobs" in errors


# --- every field honoured or refused ----------------------------------------------------


def test_an_out_of_band_response_stays_out_of_the_conversation() -> None:
    fake = FakeBackend()
    with (
        realtime_app(fake) as client,
        client.websocket_connect("/v1/realtime", headers=AUTH) as socket,
    ):
        events_until(socket, "session.created")
        socket.send_json(message("Tell me about dogs."))
        dogs = events_until(socket, "conversation.item.done")[-1]["item"]["id"]
        socket.send_json(
            {
                "type": "response.create",
                "response": {
                    "conversation": "none",
                    "output_modalities": ["text"],
                    "metadata": {"purpose": "classify"},
                    "input": [
                        {"type": "item_reference", "id": dogs},
                        message("What about cats?")["item"],
                    ],
                },
            }
        )
        events = events_until(socket, "response.done")
        response = events[-1]["response"]
        assert response["metadata"] == {"purpose": "classify"}
        assert response["conversation_id"] is None
        assert "conversation.item.added" not in [e["type"] for e in events]
        assert "cats" in fake.calls[-1].prompt and "dogs" in fake.calls[-1].prompt
        error = refusal(
            socket, {"type": "conversation.item.retrieve", "item_id": response["output"][0]["id"]}
        )
        assert error["code"] == "item_not_found"
        # The conversation's own response answers the conversation alone.
        socket.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        assert events_until(socket, "response.done")[-1]["response"]["conversation_id"]
        assert "cats" not in fake.calls[-1].prompt and "dogs" in fake.calls[-1].prompt


def test_a_response_can_be_cancelled_by_its_id() -> None:
    fake = FakeBackend(token_delay_s=0.2)
    with (
        realtime_app(fake) as client,
        client.websocket_connect("/v1/realtime", headers=AUTH) as socket,
    ):
        events_until(socket, "session.created")
        say_hi(socket)
        events_until(socket, "conversation.item.done")
        create = {"conversation": "none", "output_modalities": ["text"]}
        socket.send_json({"type": "response.create", "response": create})
        created = events_until(socket, "response.created")[-1]["response"]["id"]
        error = refusal(socket, {"type": "response.cancel", "response_id": "resp_other"})
        assert (error["code"], error["param"]) == ("response_cancel_not_active", "response_id")
        socket.send_json({"type": "response.cancel", "response_id": created})
        assert events_until(socket, "response.done")[-1]["response"]["status"] == "cancelled"


REFUSED: list[tuple[dict[str, Any], str, str]] = [
    (update(foo=1), "unknown_parameter", "session.foo"),
    (
        update(tools=[{"type": "mcp", "server_label": "x"}]),
        "unsupported_tool",
        "session.tools[0].type",
    ),
    (update(tool_choice="required"), "invalid_value", "session.tool_choice"),
    (
        update(
            tools=[{"type": "function", "name": "f"}], tool_choice={"type": "function", "name": "g"}
        ),
        "invalid_value",
        "session.tool_choice",
    ),
    (
        update(tracing={"workflow_name": "x", "sampling": 1}),
        "unknown_parameter",
        "session.tracing.sampling",
    ),
    (update(truncation="auto"), "unsupported_parameter", "session.truncation"),
    (update(prompt={"id": "pmpt_1"}), "unsupported_parameter", "session.prompt"),
    (
        update(include=["item.input_audio_transcription.logprobs"]),
        "unsupported_parameter",
        "session.include",
    ),
    (
        update(audio={"input": {"noise_reduction": {"type": "near_field"}}}),
        "unsupported_parameter",
        "session.audio.input.noise_reduction",
    ),
    (
        update(audio={"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5}}}),
        "unsupported_parameter",
        "session.audio.input.turn_detection.idle_timeout_ms",
    ),
    (
        update(audio={"input": {"transcription": {"keywords": ["gateway"]}}}),
        "unsupported_parameter",
        "session.audio.input.transcription.keywords",
    ),
    (
        update(audio={"input": {"transcription": {"language": "fr"}}}),
        "unsupported_language",
        "session.audio.input.transcription.language",
    ),
    (
        update(audio={"output": {"voice": "joe", "pitch": 2}}),
        "unknown_parameter",
        "session.audio.output.pitch",
    ),
    (
        {"type": "response.create", "response": {"tools": [{"type": "function", "name": "f g"}]}},
        "invalid_value",
        "response.tools[0].name",
    ),
    (
        {"type": "response.create", "response": {"reasoning": {"effort": "low"}}},
        "unsupported_parameter",
        "response.reasoning",
    ),
    (
        {"type": "response.create", "response": {"conversation": "conv_1"}},
        "invalid_value",
        "response.conversation",
    ),
    (
        {"type": "response.create", "response": {"metadata": {str(i): "v" for i in range(17)}}},
        "invalid_value",
        "response.metadata",
    ),
    (
        {"type": "response.create", "response": {"metadata": {"k": "v" * 513}}},
        "invalid_value",
        "response.metadata.k",
    ),
    (
        {"type": "response.create", "response": {"model": "fake-plain"}},
        "unknown_parameter",
        "response.model",
    ),
    (
        {"type": "input_audio_buffer.commit", "item_id": "item_1"},
        "unknown_parameter",
        "item_id",
    ),
    (
        message("Hi", foo="bar"),
        "unknown_parameter",
        "item.foo",
    ),
]


def test_every_field_is_honoured_or_refused_by_name(realtime: TestClient) -> None:
    with realtime.websocket_connect("/v1/realtime", headers=AUTH) as socket:
        events_until(socket, "session.created")
        say_hi(socket)
        events_until(socket, "conversation.item.done")
        for event, code, param in REFUSED:
            error = refusal(socket, event)
            assert (error["code"] or error["type"], error["param"]) == (code, param), event
        # What asks for nothing is taken: no tools, no noise reduction; tracing is metadata.
        accepted = update(
            tools=[],
            tool_choice="none",
            tracing={"workflow_name": "Voice agent", "group_id": "g-1"},
            truncation="disabled",
            audio={"input": {"noise_reduction": None}},
        )
        socket.send_json(accepted)
        session = events_until(socket, "session.updated")[-1]["session"]
        assert session["tool_choice"] == "none"
        assert session["tracing"] == {"workflow_name": "Voice agent", "group_id": "g-1"}


def test_semantic_vad_ends_a_turn_after_the_silence_its_eagerness_maps_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Agents SDK's RealtimeAgent asks for ``semantic_vad``: no model here judges whether
    the user has finished, so its ``eagerness`` sets the silence that ends the turn (low:
    1.2 s, medium and auto: 0.6 s, high: 0.3 s). 400 ms of quiet ends a turn for ``high``
    and not for ``low``."""
    from gateway.serving import vad

    monkeypatch.setattr(vad, "SileroVAD", LoudnessVAD)
    with (
        realtime_app(FakeBackend()) as client,
        client.websocket_connect("/v1/realtime", headers=AUTH) as socket,
    ):
        events_until(socket, "session.created")
        for eagerness, ends in (("low", False), ("high", True)):
            detection = {"type": "semantic_vad", "eagerness": eagerness}
            socket.send_json(update(audio={"input": {"turn_detection": detection}}))
            session = events_until(socket, "session.updated")[-1]["session"]
            shown = session["audio"]["input"]["turn_detection"]
            assert (shown["type"], shown["eagerness"]) == ("semantic_vad", eagerness)
            socket.send_json({"type": "input_audio_buffer.append", "audio": tone(1.0)})
            for _ in range(3):
                socket.send_json({"type": "input_audio_buffer.append", "audio": silence(0.1)})
            quiet = {"type": "input_audio_buffer.append", "audio": silence(0.1)}
            kinds = [event["type"] for event in answer(socket, quiet)]
            assert ("input_audio_buffer.speech_stopped" in kinds) is ends, (eagerness, kinds)
            socket.send_json({"type": "input_audio_buffer.clear"})
            events_until(socket, "input_audio_buffer.cleared")
        bad = {"type": "semantic_vad", "eagerness": "eager"}
        error = refusal(socket, update(audio={"input": {"turn_detection": bad}}))
        assert error["param"] == "session.audio.input.turn_detection.eagerness"
