"""What voice agents use in a Realtime session (the fake backend, Starlette's test client):
function tools (a call is an item of its own, never spoken; its output continues the
turn), input transcription deltas, and G.711 audio in and out."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from gateway.backend.fake import FakeBackend
from gateway.serving.g711 import decode, encode
from tests.unit.conftest import ADMIN_KEY
from tests.unit.test_realtime import message, serve, until, update

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
    with serve(fake) as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        until(ws, "session.created")
        ws.send_json(update(tools=[WEATHER], output_modalities=["text"]))
        session = until(ws, "session.updated")[-1]["session"]
        assert session["tools"] == [WEATHER] and session["tool_choice"] == "auto"
        ws.send_json(message("What is the weather in Paris?"))
        ws.send_json({"type": "response.create"})
        events = until(ws, "response.done")
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
        added = until(ws, "conversation.item.done")[-1]["item"]
        assert added["type"] == "function_call_output"
        ws.send_json({"type": "response.create"})
        answer = until(ws, "response.done")[-1]["response"]
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
    with serve(fake) as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        until(ws, "session.created")
        ws.send_json(update(tools=[WEATHER]))
        until(ws, "session.updated")
        ws.send_json(message("Weather in Oslo and Rome?"))
        ws.send_json({"type": "response.create"})
        events = until(ws, "response.done")
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
        response = until(ws, "response.done")[-1]["response"]
        assert [item["type"] for item in response["output"]] == ["function_call"]


def test_tool_choice_none_and_a_response_without_tools_say_the_text() -> None:
    fake = FakeBackend()
    text = hermes_call("get_weather", city="Paris")
    fake.replies = [text, text]
    with serve(fake) as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        until(ws, "session.created")
        ws.send_json(update(tools=[WEATHER], output_modalities=["text"]))
        until(ws, "session.updated")
        ws.send_json(message("Hi"))
        for override in ({"tool_choice": "none"}, {"tools": []}):
            ws.send_json({"type": "response.create", "response": override})
            response = until(ws, "response.done")[-1]["response"]
            assert [item["type"] for item in response["output"]] == ["message"], override


def test_input_transcription_arrives_in_deltas_then_completed() -> None:
    with serve() as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        until(ws, "session.created")
        ws.send_json(update(audio={"input": {"turn_detection": None}}))
        until(ws, "session.updated")
        pcm = (np.sin(np.arange(24_000 * 2) / 10) * 3000).astype("<i2").tobytes()
        ws.send_json({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        ws.send_json({"type": "input_audio_buffer.commit"})
        events = until(ws, "conversation.item.input_audio_transcription.completed")
        deltas = events_of(events, "conversation.item.input_audio_transcription.delta")
        # The fake transcribes each started second as a segment: two deltas, in order.
        assert [d["delta"].strip() for d in deltas] == [
            "Segment 1 says hello.",
            "Segment 2 says hello.",
        ]
        assert "".join(d["delta"] for d in deltas) == events[-1]["transcript"]


def test_g711_audio_goes_in_and_comes_out_at_8_khz() -> None:
    fake = FakeBackend()
    with serve(fake) as client, client.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        until(ws, "session.created")
        formats = {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None}}
        formats["output"] = {"format": {"type": "audio/pcmu"}}
        ws.send_json(update(audio=formats))
        session = until(ws, "session.updated")[-1]["session"]
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
        heard = until(ws, "conversation.item.input_audio_transcription.completed")[-1]
        # Two seconds reached the transcription model (16 kHz): two segments.
        assert heard["transcript"].count("says hello") == 2
        assert abs(fake.transcribe_calls[-1][1].size - 32_000) < 400
        ws.send_json({"type": "response.create"})
        events = until(ws, "response.done")
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
