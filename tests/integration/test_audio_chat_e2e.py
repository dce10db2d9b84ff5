"""Audio in and out of chat completions, end to end with the official SDK: ``input_audio``
parts heard by Whisper, answers spoken by Piper, streamed and not, and an earlier answer's
audio referred to by its id."""

from __future__ import annotations

import base64
import time
from typing import Any

import openai
import pytest

from tests.support.audio import decode, wav_bytes
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

#: mock_chat says exactly this (its [mock:say=...] directive, percent-encoded).
SAID = "Paris is the capital of France."
SAY = "[mock:say=" + SAID.replace(" ", "%20") + "]"


@pytest.fixture(scope="module")
def question_wav(stack: GatewayProcess) -> str:
    pcm = stack.clear_speech("What is the capital of France?", heard="capital of France")
    return base64.b64encode(wav_bytes(pcm)).decode()


def test_input_audio_is_heard_as_its_words(client: openai.OpenAI, question_wav: str) -> None:
    spoken = client.chat.completions.create(
        model="mock_chat",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Question:"},
                    {"type": "input_audio", "input_audio": {"data": question_wav, "format": "wav"}},
                ],
            }
        ],
    )
    written = client.chat.completions.create(
        model="mock_chat",
        messages=[{"role": "user", "content": "Question:\nWhat is the capital of France?"}],
    )
    # mock_chat counts a prompt token per word: the audio became the same words.
    assert spoken.usage is not None and written.usage is not None
    assert spoken.usage.prompt_tokens == written.usage.prompt_tokens


def test_bad_input_audio_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="mock_chat",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "input_audio",
                            "input_audio": {"data": base64.b64encode(b"not audio").decode()},
                        }
                    ],
                }
            ],
        )
    error: Any = refused.value.body
    assert error["code"] == "invalid_audio"
    assert error["param"] == "messages.[0].content.[0].input_audio"


def test_spoken_answer_and_a_reference_to_it(client: openai.OpenAI, stack: GatewayProcess) -> None:
    answer = client.chat.completions.create(
        model="mock_chat",
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        messages=[{"role": "user", "content": SAY}],
    )
    message = answer.choices[0].message
    assert message.content is None and message.audio is not None
    assert message.audio.transcript == SAID
    assert message.audio.expires_at > time.time() + 60
    wav = base64.b64decode(message.audio.data)
    samples, _ = decode(wav, "wav")
    assert samples.size > 0
    # What the audio says is the transcript.
    heard = client.audio.transcriptions.create(model="whisper_stt", file=("a.wav", wav))
    # Piper's speech varies a little from run to run; Whisper tiny once heard "Harris".
    assert "capital of france" in heard.text.lower()
    # A later turn may stand for the answer by its audio id: the model sees its transcript.
    by_id = client.chat.completions.create(
        model="mock_chat",
        messages=[
            {"role": "user", "content": SAY},
            {"role": "assistant", "audio": {"id": message.audio.id}},
            {"role": "user", "content": "And?"},
        ],
    )
    by_text = client.chat.completions.create(
        model="mock_chat",
        messages=[
            {"role": "user", "content": SAY},
            {"role": "assistant", "content": SAID},
            {"role": "user", "content": "And?"},
        ],
    )
    assert by_id.usage is not None and by_text.usage is not None
    assert by_id.usage.prompt_tokens == by_text.usage.prompt_tokens
    # Another key cannot read it.
    created = stack.create_key("other")
    with pytest.raises(openai.BadRequestError) as refused:
        stack.client(created["key"]).chat.completions.create(
            model="mock_chat",
            messages=[
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "audio": {"id": message.audio.id}},
                {"role": "user", "content": "And?"},
            ],
        )
    error: Any = refused.value.body
    assert error["code"] == "audio_not_found"


def test_streamed_spoken_answer(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="mock_chat",
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        messages=[{"role": "user", "content": SAY}],
        stream=True,
        stream_options={"include_usage": True},
    )
    transcript, pcm, ids, finish, expires, usage = [], b"", set(), None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        audio: Any = getattr(choice.delta, "audio", None)
        if not audio:
            continue
        ids.add(audio.id)
        transcript.append(audio.transcript or "")
        pcm += base64.b64decode(audio.data or "")
        expires = audio.expires_at or expires
    assert "".join(transcript) == SAID
    assert len(ids) == 1 and expires is not None
    assert finish == "stop"
    assert len(pcm) / 2 / 24_000 > 0.5  # 24 kHz pcm16, several words long
    assert usage is not None and usage.completion_tokens > 0


def test_audio_output_needs_its_parameters(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="mock_chat",
            modalities=["text", "audio"],
            messages=[{"role": "user", "content": "Hi"}],
        )
    error: Any = refused.value.body
    assert error["param"] == "audio"
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(
            model="mock_chat",
            modalities=["text", "audio"],
            audio={"voice": "nobody", "format": "wav"},
            messages=[{"role": "user", "content": "Hi"}],
        )
    error = unknown.value.body
    assert error["param"] == "audio.voice"
