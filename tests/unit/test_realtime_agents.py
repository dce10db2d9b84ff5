"""What voice agents use in a Realtime session (the fake backend, Starlette's test client):
function tools (a call is an item of its own, never spoken; its output continues the
turn), input transcription deltas, and G.711 audio in and out."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from gateway.app import create_app
from gateway.backend.fake import FakeBackend
from gateway.serving.g711 import decode, encode
from tests.support.inprocess import ADMIN_KEY, bearer, make_settings
from tests.support.realtime import (
    LoudnessVAD,
    create_key,
    events_until,
    message,
    realtime_app,
    refusal,
    update,
)

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def hermes_call(name: str, **arguments: Any) -> str:
    """A call as the fake chat model (hermes format) writes it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def events_of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == kind]


def test_a_function_call_is_an_item_with_its_arguments_and_its_output_continues_the_turn() -> None:
    fake = FakeBackend()
    fake.replies = [hermes_call("get_weather", city="Paris"), "It is sunny in Paris."]
    with realtime_app(fake) as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        events_until(ws, "session.created")
        ws.send_json(update(tools=[WEATHER], output_modalities=["text"]))
        session = events_until(ws, "session.updated")[-1]["session"]
        assert session["tools"] == [WEATHER] and session["tool_choice"] == "auto"
        ws.send_json(message("What is the weather in Paris?"))
        ws.send_json({"type": "response.create"})
        events = events_until(ws, "response.done")
        # The tools reached the chat model's template; the call is not said as text.
        assert "get_weather" in fake.calls[-1].prompt
        assert not events_of(events, "response.output_text.delta")
        done = events_of(events, "response.function_call_arguments.done")
        assert len(done) == 1 and json.loads(done[0]["arguments"]) == {"city": "Paris"}
        deltas = events_of(events, "response.function_call_arguments.delta")
        assert "".join(d["delta"] for d in deltas) == done[0]["arguments"]
        response = events[-1]["response"]
        assert response["status"] == "completed"
        (call,) = response["output"]
        assert (call["type"], call["name"], call["call_id"]) == (
            "function_call",
            "get_weather",
            done[0]["call_id"],
        )
        assert call["status"] == "completed"
        # The client runs it and sends the output back; the next response answers with it.
        ws.send_json(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "function_call_output",
                    "call_id": call["call_id"],
                    "output": '{"sky": "sunny"}',
                },
            }
        )
        added = events_until(ws, "conversation.item.done")[-1]["item"]
        assert added["type"] == "function_call_output"
        ws.send_json({"type": "response.create"})
        answer = events_until(ws, "response.done")[-1]["response"]
        assert answer["output"][0]["content"][0]["text"] == "It is sunny in Paris."
        prompt = fake.calls[-1].prompt
        # The template saw the call and its result, in order.
        assert prompt.index("get_weather") < prompt.index('{"sky": "sunny"}')


def test_a_call_in_a_spoken_answer_is_not_spoken_and_parallel_calls_are_items() -> None:
    fake = FakeBackend()
    fake.replies = [
        "Let me check. "
        + hermes_call("get_weather", city="Oslo")
        + hermes_call("get_weather", city="Rome")
    ]
    with realtime_app(fake) as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        events_until(ws, "session.created")
        ws.send_json(update(tools=[WEATHER]))
        events_until(ws, "session.updated")
        ws.send_json(message("Weather in Oslo and Rome?"))
        ws.send_json({"type": "response.create"})
        events = events_until(ws, "response.done")
        response = events[-1]["response"]
        kinds = [item["type"] for item in response["output"]]
        assert kinds == ["message", "function_call", "function_call"]
        cities = [json.loads(item["arguments"])["city"] for item in response["output"][1:]]
        assert cities == ["Oslo", "Rome"]
        transcript = response["output"][0]["content"][0]["transcript"]
        assert transcript.strip() == "Let me check." and "tool_call" not in transcript
        spoken = [text for _, text, _, _ in fake.speech_calls]
        assert not any("tool_call" in text or "Oslo" in text for text in spoken)
        # parallel_tool_calls false: one call, what follows it dropped.
        fake.replies = [
            hermes_call("get_weather", city="Oslo") + hermes_call("get_weather", city="Rome")
        ]
        create = {"parallel_tool_calls": False, "output_modalities": ["text"]}
        ws.send_json({"type": "response.create", "response": create})
        response = events_until(ws, "response.done")[-1]["response"]
        assert [item["type"] for item in response["output"]] == ["function_call"]


def test_tool_choice_none_and_a_response_without_tools_say_the_text() -> None:
    fake = FakeBackend()
    text = hermes_call("get_weather", city="Paris")
    fake.replies = [text, text]
    with realtime_app(fake) as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        events_until(ws, "session.created")
        ws.send_json(update(tools=[WEATHER], output_modalities=["text"]))
        events_until(ws, "session.updated")
        ws.send_json(message("Hi"))
        for override in ({"tool_choice": "none"}, {"tools": []}):
            ws.send_json({"type": "response.create", "response": override})
            response = events_until(ws, "response.done")[-1]["response"]
            assert [item["type"] for item in response["output"]] == ["message"], override


def test_input_transcription_arrives_in_deltas_then_completed() -> None:
    with realtime_app() as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        events_until(ws, "session.created")
        ws.send_json(update(audio={"input": {"turn_detection": None}}))
        events_until(ws, "session.updated")
        pcm = (np.sin(np.arange(24_000 * 2) / 10) * 3000).astype("<i2").tobytes()
        ws.send_json({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        ws.send_json({"type": "input_audio_buffer.commit"})
        events = events_until(ws, "conversation.item.input_audio_transcription.completed")
        deltas = events_of(events, "conversation.item.input_audio_transcription.delta")
        # The fake transcribes each started second as a segment: two deltas, in order.
        assert [d["delta"].strip() for d in deltas] == [
            "Segment 1 says hello.",
            "Segment 2 says hello.",
        ]
        assert "".join(d["delta"] for d in deltas) == events[-1]["transcript"]


def test_g711_audio_goes_in_and_comes_out_at_8_khz() -> None:
    fake = FakeBackend()
    with realtime_app(fake) as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        events_until(ws, "session.created")
        formats = {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None}}
        formats["output"] = {"format": {"type": "audio/pcmu"}}
        ws.send_json(update(audio=formats))
        session = events_until(ws, "session.updated")[-1]["session"]
        assert session["audio"]["input"]["format"] == {"type": "audio/pcmu"}
        # 2 s of a tone as a phone sends it: 8,000 mu-law bytes a second.
        tone = (np.sin(2 * np.pi * 300 * np.arange(16_000) / 8000) * 8000).astype(np.int16)
        ws.send_json(
            {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(encode(tone, "pcmu")).decode(),
            }
        )
        ws.send_json({"type": "input_audio_buffer.commit"})
        heard = events_until(ws, "conversation.item.input_audio_transcription.completed")[-1]
        # Two seconds reached the transcription model (16 kHz): two segments.
        assert heard["transcript"].count("says hello") == 2
        assert abs(fake.transcribe_calls[-1][1].size - 32_000) < 400
        ws.send_json({"type": "response.create"})
        events = events_until(ws, "response.done")
        audio = b"".join(
            base64.b64decode(e["delta"]) for e in events_of(events, "response.output_audio.delta")
        )
        # The fake speaks 0.5 s of 440 Hz per sentence: 4,000 mu-law bytes each.
        sentences = len(fake.speech_calls[-1][1].split(".")) - 1
        assert abs(len(audio) - 4000 * sentences) < 50 * sentences
        samples = decode(audio, "pcmu").astype(np.float64)
        spectrum = np.abs(np.fft.rfft(samples[:4000]))
        assert abs(np.argmax(spectrum) * 8000 / 4000 - 440) < 5
        assert events[-1]["response"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}


def test_a_transcription_session_transcribes_turns_and_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gateway.serving import vad

    monkeypatch.setattr(vad, "SileroVAD", LoudnessVAD)  # a tone is speech
    fake = FakeBackend()
    with realtime_app(fake) as client:
        # A key for the transcription model alone: enough for this session, not a conversation.
        key = create_key(client, models=["fake-stt"])["key"]
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect("/v1/realtime", headers=bearer(key)),
        ):
            pass
        assert refused.value.status_code == 403
        url = "/v1/realtime?intent=transcription"
        with client.websocket_connect(url, headers=bearer(key)) as ws:
            session = events_until(ws, "session.created")[-1]["session"]
            assert (session["type"], session["object"]) == (
                "transcription",
                "realtime.transcription_session",
            )
            assert "model" not in session and "output_modalities" not in session
            detection = {"type": "server_vad", "silence_duration_ms": 200}
            spec = {"type": "transcription", "audio": {"input": {"turn_detection": detection}}}
            ws.send_json({"type": "session.update", "session": spec})
            events_until(ws, "session.updated")
            pcm = (np.sin(np.arange(24_000 * 2) / 10) * 3000).astype("<i2").tobytes()
            pcm += bytes(24_000 * 2)  # a second of silence: the VAD ends the turn
            for offset in range(0, len(pcm), 4800):
                piece = base64.b64encode(pcm[offset : offset + 4800]).decode()
                ws.send_json({"type": "input_audio_buffer.append", "audio": piece})
            events = events_until(ws, "conversation.item.input_audio_transcription.completed")
            kinds = [event["type"] for event in events]
            assert "input_audio_buffer.speech_stopped" in kinds
            assert "conversation.item.input_audio_transcription.delta" in kinds
            assert "says hello" in events[-1]["transcript"]
            error = refusal(ws, {"type": "response.create"})
            assert (error["code"], error["param"]) == ("invalid_event", "type")
            error = refusal(ws, update(instructions="Talk."))
            assert error["param"] == "session.type"
            assert not fake.calls  # the chat model never ran


def test_a_beta_client_is_refused_at_the_upgrade() -> None:
    with realtime_app() as client:
        for headers, protocols in (
            ({**AUTH, "OpenAI-Beta": "realtime=v1"}, None),
            (dict(AUTH), ["realtime", "openai-beta.realtime-v1"]),  # (Starlette adds to it)
        ):
            with (
                pytest.raises(WebSocketDenialResponse) as refused,
                client.websocket_connect("/v1/realtime", headers=headers, subprotocols=protocols),
            ):
                pass
            assert refused.value.status_code == 400
            error = refused.value.json()["error"]
            assert error["code"] == "unsupported_interface" and "GA" in error["message"]
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect("/v1/realtime?intent=translation", headers=dict(AUTH)),
        ):
            pass
        assert refused.value.json()["error"]["param"] == "intent"


def test_an_openai_model_name_in_an_update_keeps_the_session_s_model() -> None:
    """The Agents SDK names ``gpt-realtime-2.1`` (and ``gpt-4o-mini-transcribe``) in every
    ``session.update``: the model the session was opened with stays."""
    settings = make_settings(models=["fake-chat", "fake-plain", "fake-tts", "fake-stt"])
    with (
        TestClient(create_app(settings, backend=FakeBackend())) as client,
        client.websocket_connect("/v1/realtime?model=fake-plain", headers=AUTH) as ws,
    ):
        assert events_until(ws, "session.created")[-1]["session"]["model"] == "fake-plain"
        transcription = {"model": "gpt-4o-mini-transcribe"}
        ws.send_json(
            update(model="gpt-realtime-2.1", audio={"input": {"transcription": transcription}})
        )
        session = events_until(ws, "session.updated")[-1]["session"]
        assert session["model"] == "fake-plain"
        assert session["audio"]["input"]["transcription"]["model"] == "fake-stt"
        ws.send_json(update(model="fake-chat"))
        assert events_until(ws, "session.updated")[-1]["session"]["model"] == "fake-chat"


def test_every_client_event_type_has_its_handler() -> None:
    """A new event model without a handler would be parsed, then fail the connection."""
    from gateway.serving.realtime.protocol import EVENTS
    from gateway.serving.realtime.session import RealtimeSession
    from gateway.state.admission import BOOTSTRAP_ADMIN

    async def nothing(*_: Any) -> Any:
        return None

    with realtime_app() as client:
        realtime = client.app.state.services.realtime  # type: ignore[attr-defined]
        assert client.portal is not None
        config = client.portal.call(realtime.configure, "fake-chat", BOOTSTRAP_ADMIN)
        session = RealtimeSession(realtime, config, "fake-tts", BOOTSTRAP_ADMIN, nothing, nothing)
        assert set(session.handlers) == set(EVENTS)


def test_hostile_events_are_refused_before_they_cost() -> None:
    """What a hostile client sends is refused by its size, before it is decoded or read
    entry by entry: G.711 audio (each byte 6 of pcm16), a million-entry list, tools past
    GATEWAY_MAX_TOOLS_KB, an unknown field's name of megabytes (echoed cut short)."""
    with realtime_app() as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        events_until(ws, "session.created")
        ws.send_json(
            update(audio={"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None}})
        )
        events_until(ws, "session.updated")
        # 3 MB of mu-law is 18 MB of pcm16: past the 15 MB buffer, refused undecoded.
        mu_law = base64.b64encode(bytes(3 * 1024 * 1024)).decode()
        error = refusal(ws, {"type": "input_audio_buffer.append", "audio": mu_law})
        assert (error["code"], error["param"]) == ("input_audio_buffer_full", "audio")
        part = {"type": "input_audio", "audio": mu_law}
        item = {"type": "message", "role": "user", "content": [part]}
        error = refusal(ws, {"type": "conversation.item.create", "item": item})
        assert (error["code"], error["param"]) == ("audio_too_long", "item.content[0].audio")
        started = time.monotonic()
        error = refusal(ws, update(include=[1] * 1_000_000))
        assert time.monotonic() - started < 2  # (a million errors took seconds to list)
        assert (error["code"], error["param"]) == ("invalid_value", "session.include")
        big = {**WEATHER, "description": "x" * 600_000}
        error = refusal(ws, update(tools=[big]))
        assert (error["code"], error["param"]) == ("tools_too_large", "session.tools")
        error = refusal(ws, update(**{"k" * 100_000: 1}))
        assert error["code"] == "unknown_parameter"
        assert len(error["param"]) < 100 and len(error["message"]) < 200


def test_a_transcription_session_never_answers_a_pause_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its guesses at a pause are transcripts only: no answer is made ahead (the chat model
    the URL names is not its model: ?model= names a transcription model)."""
    from gateway.serving import vad

    monkeypatch.setattr(vad, "SileroVAD", LoudnessVAD)
    fake = FakeBackend()
    with realtime_app(fake) as client:
        url = "/v1/realtime?intent=transcription&model=fake-stt"
        with client.websocket_connect(url, headers=AUTH) as ws:
            events_until(ws, "session.created")
            detection = {"type": "server_vad", "silence_duration_ms": 1000}
            spec = {"type": "transcription", "audio": {"input": {"turn_detection": detection}}}
            ws.send_json({"type": "session.update", "session": spec})
            events_until(ws, "session.updated")
            pcm = (np.sin(np.arange(24_000) / 10) * 3000).astype("<i2").tobytes()
            for chunk in (pcm, bytes(24_000 * 2 * 3 // 10)):  # speech, then a 300 ms pause
                ws.send_json(
                    {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}
                )
            time.sleep(0.3)  # the guess at the pause is in
            ws.send_json(
                {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(bytes(24_000 * 2)).decode(),
                }
            )
            events_until(ws, "conversation.item.input_audio_transcription.completed")
        assert fake.transcribe_calls and not fake.calls and not fake.speech_calls
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect(
                "/v1/realtime?intent=transcription&model=fake-chat", headers=dict(AUTH)
            ),
        ):
            pass
        assert refused.value.json()["error"]["param"] == "model"


def test_a_guess_that_missed_the_soft_end_of_a_word_is_not_the_transcript(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guess starts at the first window the VAD hears as quiet; when what follows it is
    still sound (a soft consonant the VAD took for quiet), the turn is transcribed whole at
    its end rather than by the guess."""
    from gateway.serving import vad

    monkeypatch.setattr(vad, "SileroVAD", LoudnessVAD)  # loud (> 0.01) is speech

    def turn(tail: float) -> tuple[int, int]:
        fake = FakeBackend()
        with (
            realtime_app(fake) as client,
            client.websocket_connect("/v1/realtime", headers=AUTH) as ws,
        ):
            events_until(ws, "session.created")
            detection = {"type": "server_vad", "silence_duration_ms": 300, "create_response": False}
            ws.send_json(update(audio={"input": {"turn_detection": detection}}))
            events_until(ws, "session.updated")
            speech = np.sin(np.arange(24_000) / 10) * 3000  # 1 s, about 0.09 of full scale
            soft = np.sin(np.arange(4_800) / 3) * tail * 32768  # 200 ms under the VAD's bar
            pcm = np.concatenate([speech, soft, np.zeros(24_000)]).astype("<i2").tobytes()
            for offset in range(0, len(pcm), 4800):
                piece = base64.b64encode(pcm[offset : offset + 4800]).decode()
                ws.send_json({"type": "input_audio_buffer.append", "audio": piece})
            events_until(ws, "conversation.item.input_audio_transcription.completed")
        calls = fake.transcribe_calls
        return len(calls), calls[-1][1].size

    guessed, heard = turn(tail=0.0)
    assert guessed == 1  # the guess at the quiet after the tone is the transcript
    missed, whole = turn(tail=0.008)
    assert missed == 2 and whole > heard + 3_000  # transcribed again, with the soft end
