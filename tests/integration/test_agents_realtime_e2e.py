"""The OpenAI Agents SDK's Realtime and streamed-voice clients on the stack, as their users
run them against a custom URL: a ``RealtimeAgent`` with one function tool
(``RealtimeRunner`` over the gateway's ``/v1/realtime``, the SDK's own session settings:
``semantic_vad``, ``tracing: "auto"``, its transcription model and voice), and a
``VoicePipeline`` fed a ``StreamedAudioInput``, whose speech-to-text opens a Realtime
transcription session (``?intent=transcription``).

``mock_chat`` answers the text of the last ``[mock:say=TEXT]`` directive in its prompt, and
its chat template is Hermes': so the agent's instructions make it call the tool, and the
tool's result makes it say the answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from agents import function_tool, set_tracing_disabled
from agents.realtime import (
    AssistantMessageItem,
    AssistantText,
    RealtimeAgent,
    RealtimeError,
    RealtimeHistoryUpdated,
    RealtimeRawModelEvent,
    RealtimeRunner,
    RealtimeSession,
    RealtimeSessionEvent,
    RealtimeToolCallItem,
    RealtimeToolEnd,
)
from agents.realtime.model_events import RealtimeModelRawServerEvent
from agents.voice import (
    StreamedAudioInput,
    VoiceStreamEventAudio,
    VoiceStreamEventError,
    VoiceStreamEventLifecycle,
)

from tests.support.audio import silence
from tests.support.bodies import mock_say
from tests.support.stack import GatewayProcess
from tests.support.voice import voice_pipeline

pytestmark = pytest.mark.integration

RATE = 24_000  # pcm16 mono, what both clients send and ask for
PIECE = RATE // 10  # 100 ms of samples: a microphone's buffer

#: What the model writes in the Hermes format (mock_chat's tool-call parser).
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is 21 degrees in Paris."


def ws_url(stack: GatewayProcess, query: str) -> str:
    return stack.base_url.replace("http://", "ws://", 1) + "/v1/realtime?" + query


async def test_realtime_agent_calls_its_tool_and_says_the_result(stack: GatewayProcess) -> None:
    set_tracing_disabled(True)  # the SDK's own traces go to OpenAI's servers, unreachable here
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return mock_say(f"It is 21 degrees in {city}.")

    agent = RealtimeAgent(
        name="Weather",
        instructions=f"You tell the weather. {mock_say(CALL)}",
        tools=[get_weather],
    )
    runner = RealtimeRunner(agent, config={"model_settings": {"output_modalities": ["text"]}})
    session = await runner.run(
        model_config={
            "url": ws_url(stack, "model=mock_chat"),
            "api_key": stack.admin_key,
        }
    )
    async with session:
        await session.send_message("What is the weather in Paris?")
        # Until the second turn (the answer after the tool's output) has ended: the tool
        # may end before or after the first turn's own end.
        seen = await session_events_until(
            session, lambda seen: responses_done(seen) == 2, "agent_end"
        )

    errors = [e.error for e in seen if isinstance(e, RealtimeError)]
    assert not errors, errors
    server = server_events(seen)
    # The session runs on the model its URL named (the SDK's session.update names its own
    # default model, gpt-realtime-2.1: an OpenAI name, which keeps the session's).
    models = {e["session"]["model"] for e in server if e["type"] == "session.updated"}
    assert models == {"mock_chat"}, models
    # Two responses: the call, not said, then the answer the tool's result asked for.
    texts: dict[str, str] = {}
    for e in server:
        if e["type"] == "response.created":
            texts[e["response"]["id"]] = ""
        elif e["type"] == "response.output_text.delta":
            texts[e["response_id"]] += e["delta"]
    assert list(texts.values()) == ["", ANSWER]
    # The tool ran once, with the arguments the model wrote, and its result went back.
    assert cities == ["Paris"]
    ends = [e for e in seen if isinstance(e, RealtimeToolEnd)]
    assert len(ends) == 1 and [e.type for e in seen].count("tool_start") == 1
    assert json.loads(ends[0].arguments) == {"city": "Paris"}
    assert ends[0].output == mock_say(ANSWER)
    added = [e["item"] for e in server if e["type"] == "conversation.item.added"]
    outputs = [item["output"] for item in added if item["type"] == "function_call_output"]
    assert outputs == [mock_say(ANSWER)]
    # The session's history: the user's question, the call with its output, the answer.
    history = [e for e in seen if isinstance(e, RealtimeHistoryUpdated)][-1].history
    assert [item.type for item in history] == ["message", "function_call", "message"], history
    call, answer = history[1], history[2]
    assert isinstance(call, RealtimeToolCallItem) and call.name == "get_weather"
    assert call.output == mock_say(ANSWER)
    assert isinstance(answer, AssistantMessageItem)
    assert [part.text for part in answer.content if isinstance(part, AssistantText)] == [ANSWER]


def responses_done(events: list[RealtimeSessionEvent]) -> int:
    return sum(1 for e in server_events(events) if e["type"] == "response.done")


def server_events(events: list[RealtimeSessionEvent]) -> list[dict[str, Any]]:
    """The server's own events, which the SDK forwards as they came."""
    return [
        e.data.data
        for e in events
        if isinstance(e, RealtimeRawModelEvent) and isinstance(e.data, RealtimeModelRawServerEvent)
    ]


async def session_events_until(
    session: RealtimeSession,
    ready: Callable[[list[RealtimeSessionEvent]], bool],
    last: str,
    timeout_s: float = 10,
) -> list[RealtimeSessionEvent]:
    """The session's events up to the first of type ``last`` once ``ready(seen)``, or up to
    an error, or all of them within ``timeout_s`` (the assertions then say what is
    missing)."""
    seen: list[RealtimeSessionEvent] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            async for event in session:
                seen.append(event)
                if event.type == "error" or (event.type == last and ready(seen)):
                    break
    return seen


async def test_voice_pipeline_with_streamed_audio_hears_and_answers(stack: GatewayProcess) -> None:
    set_tracing_disabled(True)
    question = stack.clear_speech("What is the capital of France?", heard="capital of France")
    instructions = f"Answer in one short sentence. {mock_say('Paris is the capital.')}"
    pipeline, heard = voice_pipeline(stack, instructions)
    microphone = StreamedAudioInput()  # type: ignore[no-untyped-call]
    result = await pipeline.run(microphone)

    async def speak() -> None:
        """The question, then a second of silence, in 100 ms pieces at the pace of speech;
        then the microphone is closed."""
        samples = np.frombuffer(question + silence(1.0), np.int16)
        for start in range(0, samples.size, PIECE):
            await microphone.add_audio(samples[start : start + PIECE])
            await asyncio.sleep(0.1)
        await microphone.add_audio(None)

    lifecycle: list[str] = []
    chunks: list[np.ndarray[Any, Any]] = []
    errors: list[Exception] = []

    async def listen() -> None:
        async for event in result.stream():
            if isinstance(event, VoiceStreamEventAudio) and event.data is not None:
                chunks.append(event.data)
            elif isinstance(event, VoiceStreamEventLifecycle):
                lifecycle.append(event.event)
            elif isinstance(event, VoiceStreamEventError):
                errors.append(event.error)

    async with asyncio.timeout(25):
        await asyncio.gather(speak(), listen())

    assert not errors, errors
    assert lifecycle == ["turn_started", "turn_ended", "session_ended"]
    assert len(heard.transcriptions) == 1
    assert "capital of france" in heard.transcriptions[0].lower(), heard.transcriptions
    audio = np.concatenate(chunks).astype(np.int16)
    assert 0.8 < audio.size / RATE < 6, audio.size / RATE  # "Paris is the capital.", spoken
    loud = np.sqrt(np.mean((audio.astype(np.float64) / 32768) ** 2))
    assert loud > 0.02, loud  # speech, not silence
