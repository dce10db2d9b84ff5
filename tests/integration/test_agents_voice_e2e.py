"""The OpenAI Agents SDK's ``VoicePipeline`` on the stack, as its docs show it for a custom
OpenAI base URL: a ``SingleAgentVoiceWorkflow`` whose agent runs on ``mock_chat`` through
the gateway, ``whisper_stt`` hearing the question and ``piper_tts`` speaking the answer with
the SDK's default TTS settings, which send ``instructions`` (a voice that cannot follow them
reads the same words; issue 36)."""

from __future__ import annotations

import re

import numpy as np
import openai
import pytest
from agents import set_tracing_disabled
from agents.voice import (
    AudioInput,
    VoiceStreamEventAudio,
    VoiceStreamEventLifecycle,
)

from tests.support.audio import wav_bytes
from tests.support.stack import GatewayProcess
from tests.support.voice import voice_pipeline

pytestmark = pytest.mark.integration

RATE = 24_000  # the SDK asks for pcm: 24 kHz 16-bit mono
#: mock_chat's answer, which piper_tts speaks.
ANSWER = {"quick", "brown", "fox", "jumps", "lazy", "dog"}


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


async def test_voice_pipeline_hears_the_question_and_speaks_the_answer(
    stack: GatewayProcess,
) -> None:
    set_tracing_disabled(True)  # the SDK's traces go to OpenAI's servers, unreachable here
    question = stack.clear_speech("What is the capital of France?", heard="capital of France")
    pipeline, heard = voice_pipeline(stack, "Answer in one short sentence.")
    assert pipeline.config.tts_settings.instructions  # the default the SDK sends

    result = await pipeline.run(AudioInput(buffer=np.frombuffer(question, np.int16)))
    lifecycle, chunks = [], []
    async for event in result.stream():
        if isinstance(event, VoiceStreamEventAudio) and event.data is not None:
            chunks.append(event.data)
        elif isinstance(event, VoiceStreamEventLifecycle):
            lifecycle.append(event.event)

    assert lifecycle == ["turn_started", "turn_ended", "session_ended"]
    assert len(heard.transcriptions) == 1 and "capital of france" in heard.transcriptions[0].lower()
    audio = np.concatenate(chunks).astype(np.int16)
    seconds = audio.size / RATE
    assert 1.5 < seconds < 8, seconds  # nine words, spoken
    loud = np.sqrt(np.mean((audio.astype(np.float64) / 32768) ** 2))
    assert loud > 0.02, loud  # speech, not silence
    # Whisper hears the answer in it (most of its words: Piper's voice varies a little).
    said = await stack.async_client().audio.transcriptions.create(
        model="whisper_stt", file=("answer.wav", wav_bytes(audio.tobytes(), RATE))
    )
    assert len(words(said.text) & ANSWER) >= 4, said.text


async def test_piper_lists_instructions_as_accepted_not_honoured(stack: GatewayProcess) -> None:
    client = stack.async_client()
    piper = await client.models.retrieve("piper_tts")
    assert piper.model_extra is not None
    assert "instructions" in piper.model_extra["ignored_parameters"]
    assert "instructions" not in piper.model_extra["parameters"]
    plain = await client.audio.speech.create(
        model="piper_tts", voice="alloy", input="Hello there.", response_format="pcm"
    )
    styled = await client.audio.speech.create(
        model="piper_tts",
        voice="alloy",
        input="Hello there.",
        response_format="pcm",
        instructions="Speak like a pirate.",
    )
    # The same words in the voice's one style (Piper's noise makes no two renditions equal).
    assert 0.5 < len(styled.content) / len(plain.content) < 2
    with pytest.raises(openai.BadRequestError):  # instructions are bounded
        await client.audio.speech.create(
            model="piper_tts", voice="alloy", input="Hi.", instructions="x" * 4097
        )
