"""The Realtime API end to end: the official SDK's ``client.realtime.connect()`` through
nginx to the gateway, Silero VAD, Whisper, SmolLM2 and Piper on the real Triton.

The spoken questions are synthesized by ``piper_tts`` (``/v1/audio/speech``, pcm), so the
audio is real speech; it is sent faster than real time (the VAD goes by the audio's own
clock, not the wall clock)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest
import websockets
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from tests.support.audio import silence, wav_bytes
from tests.support.generation import generation_stops
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

PCM_RATE = 24_000
CHUNK = PCM_RATE * 2 // 10  # 100 ms of pcm16


@pytest.fixture(scope="module")
def stack() -> Iterator[GatewayProcess]:
    """A stack of this module's own with the voice chain's models (and mock_chat, which
    answers as slowly as asked): its sessions (Whisper, SmolLM2 and Piper on every turn)
    then run on another worker than the shared stack's tests, which set the suite's time."""
    with GatewayProcess(models=[*VOICE, "mock_chat"]).running() as gateway:
        yield gateway


@pytest.fixture(scope="module")
def question(stack: GatewayProcess) -> bytes:
    """A spoken question, 24 kHz pcm16."""
    return stack.clear_speech("What is the capital of France?", heard="capital of France")


@asynccontextmanager
async def connect(
    stack: GatewayProcess, key: str | None = None, model: str = "smollm2"
) -> AsyncIterator[AsyncRealtimeConnection]:
    client = stack.async_client(key)
    async with client.realtime.connect(model=model) as connection:
        yield connection


async def send_audio(connection: AsyncRealtimeConnection, pcm: bytes) -> None:
    for start in range(0, len(pcm), CHUNK):
        audio = base64.b64encode(pcm[start : start + CHUNK]).decode()
        await connection.input_audio_buffer.append(audio=audio)


async def ask(connection: AsyncRealtimeConnection, text: str, max_tokens: int) -> None:
    """A user text message, then a response of at most ``max_tokens``."""
    await connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await connection.response.create(response={"max_output_tokens": max_tokens})


async def connection_events_until(
    connection: AsyncRealtimeConnection, last: str, timeout_s: float = 60
) -> list[Any]:
    """Every server event of the SDK's connection up to and including the first of type
    ``last`` (:func:`tests.support.realtime.events_until` is the same for the test client's
    socket, in process)."""
    seen = []
    async with asyncio.timeout(timeout_s):
        async for event in connection:
            seen.append(event)
            if event.type == last:
                return seen
    raise AssertionError(f"the connection closed before {last}: {[e.type for e in seen]}")


def types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


def first(events: list[Any], kind: str) -> int:
    return types(events).index(kind)


def pcm_seconds(events: list[Any]) -> float:
    audio = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    assert len(audio) % 2 == 0
    return len(audio) / 2 / PCM_RATE


async def test_spoken_question_gets_a_spoken_answer_in_order(
    stack: GatewayProcess, question: bytes
) -> None:
    async with connect(stack) as connection:
        await connection.session.update(session={"type": "realtime", "max_output_tokens": 40})
        await send_audio(connection, silence(0.5) + question + silence(1.2))
        events = await connection_events_until(connection, "response.done")
    kinds = types(events)
    assert kinds[0] == "session.created"
    assert events[0].session.model == "smollm2"
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "response.output_item.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.done",
    ]
    positions = [first(events, kind) for kind in order]
    assert positions == sorted(positions), kinds
    started = events[first(events, "input_audio_buffer.speech_started")]
    stopped = events[first(events, "input_audio_buffer.speech_stopped")]
    # The question starts after the 0.5 s of silence (less the VAD's 300 ms prefix
    # padding) and ends before the silence after it.
    assert 100 <= started.audio_start_ms <= 700
    question_end_ms = 500 + len(question) * 1000 // (2 * PCM_RATE)
    assert started.audio_start_ms < stopped.audio_end_ms <= question_end_ms + 100
    transcript = events[first(events, "conversation.item.input_audio_transcription.completed")]
    assert "capital" in transcript.transcript.lower()
    assert "france" in transcript.transcript.lower()
    assert transcript.item_id == stopped.item_id
    deltas = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    done = events[first(events, "response.output_audio_transcript.done")]
    assert done.transcript == deltas and deltas.strip()
    assert pcm_seconds(events) > 0.3
    response = events[-1].response
    # SmolLM2 samples (the session's temperature): now and then its answer runs past the
    # 40 tokens, and the response says so.
    if response.status != "completed":
        assert response.status == "incomplete", response
        assert response.status_details.reason == "max_output_tokens"
    assert response.usage.output_tokens > 0 and response.usage.input_tokens > 0
    assert response.output[0].content[0].transcript == deltas
    ids = [e.event_id for e in events]
    assert len(set(ids)) == len(ids)


async def test_text_conversation_and_follow_up(stack: GatewayProcess) -> None:
    async with connect(stack) as connection:
        await connection.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
            }
        )
        await ask(connection, "Say hello.", max_tokens=12)
        events = await connection_events_until(connection, "response.done")
        kinds = types(events)
        assert "session.updated" in kinds and "response.output_text.delta" in kinds
        assert "response.output_audio.delta" not in kinds
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert events[first(events, "response.output_text.done")].text == text
        assert events[-1].response.status in ("completed", "incomplete")
        # The conversation goes on: the answer is an item of it, and a second response
        # reads the whole conversation (more input tokens than the first).
        await ask(connection, "Again.", max_tokens=4)
        again = await connection_events_until(connection, "response.done")
        first_usage = events[-1].response.usage
        assert again[-1].response.usage.input_tokens > first_usage.input_tokens


async def test_response_cancel_stops_the_model(stack: GatewayProcess) -> None:
    async with connect(stack) as connection:
        await ask(connection, "Tell me a very long story.", max_tokens=2000)
        before = await connection_events_until(connection, "response.output_audio_transcript.delta")
        await connection.response.cancel()
        events = await connection_events_until(connection, "response.done")
        response = events[-1].response
        assert response.id == before[first(before, "response.created")].response.id
        assert response.status == "cancelled"
        assert response.status_details.reason == "client_cancelled"
        # Triton stopped generating: its token counter stands still.
        await asyncio.to_thread(generation_stops, stack, "smollm2")
        # Cancelling again: nothing to cancel, an error event, and the session goes on.
        await connection.response.cancel()
        error = await connection_events_until(connection, "error")
        assert error[-1].error.code == "response_cancel_not_active"


async def test_speech_during_an_answer_cancels_it(stack: GatewayProcess, question: bytes) -> None:
    # mock_chat, slowed down, answers for as long as it is let (a real model may finish
    # before the user speaks). The slowing is in this response's own instructions, so the
    # answer to the user's turn afterwards is a short one.
    async with connect(stack, model="mock_chat") as connection:
        await connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Talk."}],
            }
        )
        await connection.response.create(
            response={
                "instructions": "[mock:delay_ms=40] [mock:words=400]",
                "max_output_tokens": 400,
            }
        )
        await connection_events_until(connection, "response.output_audio.delta")
        await send_audio(connection, silence(0.3) + question)
        events = await connection_events_until(connection, "response.done")
        kinds = types(events)
        assert "input_audio_buffer.speech_started" in kinds
        assert events[-1].response.status == "cancelled"
        assert events[-1].response.status_details.reason == "turn_detected"
        # The user's turn is then heard and answered.
        await send_audio(connection, silence(1.0))
        after = await connection_events_until(connection, "response.done")
        transcript = after[first(after, "conversation.item.input_audio_transcription.completed")]
        assert "france" in transcript.transcript.lower()
        assert after[-1].response.status in ("completed", "incomplete")
        # The cut-off answer keeps what was said; the new one follows the user's turn.
        cut = events[-1].response.output[0]
        assert cut.status == "incomplete"


async def test_bad_events_get_error_events_and_the_session_goes_on(
    stack: GatewayProcess,
) -> None:
    async with connect(stack) as connection:
        await connection_events_until(connection, "session.created")
        sent: list[tuple[Any, str]] = [
            ("{not json", "invalid_json"),
            ({"type": "no.such.event", "event_id": "evt_1"}, "invalid_event"),
            ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
            ({"type": "response.cancel"}, "response_cancel_not_active"),
            ({"type": "input_audio_buffer.append", "audio": "%%%"}, "invalid_audio"),
            (
                {
                    "type": "session.update",
                    "session": {
                        "audio": {
                            "input": {
                                "turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}
                            }
                        }
                    },
                },
                "unsupported_parameter",
            ),
            (
                {"type": "conversation.item.delete", "item_id": "item_missing"},
                "item_not_found",
            ),
        ]
        for event, code in sent:
            await connection.send_raw(event if isinstance(event, str) else json.dumps(event))
            errors = await connection_events_until(connection, "error")
            error = errors[-1].error
            assert error.code == code, (event, error)
            assert error.message and error.type == "invalid_request_error"
        assert errors[-1].error.param  # the bad field is named
        await connection.session.update(session={"type": "realtime", "instructions": "Be brief."})
        updated = await connection_events_until(connection, "session.updated")
        assert updated[-1].session.instructions == "Be brief."


def ws_url(stack: GatewayProcess) -> str:
    return stack.base_url.replace("http://", "ws://") + "/v1/realtime?model=smollm2"


async def test_a_wrong_key_is_refused_before_the_upgrade(stack: GatewayProcess) -> None:
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        async with websockets.connect(
            ws_url(stack), additional_headers={"Authorization": "Bearer sk-gw-wrong"}
        ):
            pass
    response = refused.value.response
    assert response.status_code == 401
    assert json.loads(response.body)["error"]["code"] == "invalid_api_key"
    # The SDK surfaces the same refusal when it connects.
    with pytest.raises(websockets.exceptions.InvalidStatus) as sdk_refused:
        async with connect(stack, key="sk-gw-wrong") as connection:
            await connection.recv()
    assert sdk_refused.value.response.status_code == 401


async def test_browser_form_of_the_key(stack: GatewayProcess) -> None:
    protocols = ["realtime", f"openai-insecure-api-key.{stack.admin_key}"]
    async with websockets.connect(ws_url(stack), subprotocols=protocols) as socket:  # type: ignore[arg-type]
        assert socket.subprotocol == "realtime"
        created = json.loads(await socket.recv())
        assert created["type"] == "session.created"


async def test_limits_and_usage_count_sessions_and_responses(
    stack: GatewayProcess, question: bytes
) -> None:
    voice = ["smollm2", "whisper_stt", "piper_tts"]
    created = stack.create_key("rt", rpm=3, max_concurrency=1, models=voice)
    key_id, key = created["id"], created["key"]
    async with connect(stack, key) as connection:
        # One session at a time for this key: a second is refused before the upgrade.
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(
                ws_url(stack), additional_headers={"Authorization": f"Bearer {key}"}
            ):
                pass
        assert refused.value.response.status_code == 429
        # A model the key may not use is refused, and the session keeps its own.
        await connection.session.update(session={"type": "realtime", "model": "mock_chat"})
        refusal = await connection_events_until(connection, "error")
        assert refusal[-1].error.code == "model_not_allowed"
        await connection.session.update(session={"type": "realtime", "max_output_tokens": 8})
        updated = await connection_events_until(connection, "session.updated")
        assert updated[-1].session.model == "smollm2"
        await send_audio(connection, silence(0.3) + question + silence(1.0))
        answered = await connection_events_until(connection, "response.done")
        assert answered[-1].response.status in ("completed", "incomplete")
        # The session was one request, the turn's transcription (its early guesses
        # included) another and the response a third: rpm=3 is spent.
        await connection.response.create()
        refusal = await connection_events_until(connection, "error")
        assert refusal[-1].error.code == "rate_limit_exceeded"
    deadline = time.monotonic() + 10
    async with httpx.AsyncClient(base_url=stack.base_url, headers=stack.headers) as http:
        while True:
            usage = (await http.get(f"/admin/keys/{key_id}/usage")).json()
            if usage["requests"] >= 3 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert usage["requests"] == 3
    assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0
    question_s = len(question) / 2 / PCM_RATE
    assert question_s * 0.8 <= usage["audio_seconds_in"] <= question_s + 1.5
    assert usage["audio_seconds_out"] > 0


def metric(stack: GatewayProcess, series: str) -> float:
    """One series of the replicas' metrics (0 before it exists)."""
    text = httpx.get(stack.internal_url + "/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def speculations(stack: GatewayProcess, outcome: str) -> float:
    """The replicas' count of answers started before their turn ended, by outcome."""
    return metric(stack, f'gateway_realtime_speculations_total{{outcome="{outcome}"}}')


async def quiet_until_speculating(
    stack: GatewayProcess, connection: AsyncRealtimeConnection, most_s: float
) -> None:
    """Silence at real-time pace until the answer to the turn so far is being made ahead;
    past ``most_s`` of it, no more audio (the VAD's clock goes with the audio, so the turn
    cannot end), however long a busy machine takes to transcribe the guess."""
    sent = 0.0
    deadline = time.monotonic() + 60
    while metric(stack, "gateway_realtime_speculations_running") < 1:
        if time.monotonic() >= deadline:  # what the session said, for the failure's reader
            said = []
            with contextlib.suppress(TimeoutError):
                while True:
                    event = await asyncio.wait_for(connection.recv(), 0.5)
                    said.append(getattr(event, "transcript", None) or event.type)
            raise AssertionError(f"no answer was started ahead; the session sent: {said}")
        if sent < most_s:
            await connection.input_audio_buffer.append(
                audio=base64.b64encode(silence(0.1)).decode()
            )
            sent += 0.1
        await asyncio.sleep(0.1)


async def send_live(connection: AsyncRealtimeConnection, pcm: bytes) -> None:
    """``pcm`` at real-time pace, as a microphone sends it."""
    started = time.monotonic()
    for index, start in enumerate(range(0, len(pcm), CHUNK)):
        audio = base64.b64encode(pcm[start : start + CHUNK]).decode()
        await connection.input_audio_buffer.append(audio=audio)
        await asyncio.sleep(max(0.0, started + (index + 1) * 0.1 - time.monotonic()))


async def answered_live(
    connection: AsyncRealtimeConnection, speech: bytes, silence_s: float
) -> list[Any]:
    """Sends ``speech`` at once, then silence at real-time pace, until the answer is done."""
    await send_audio(connection, speech)
    listening = asyncio.create_task(send_live(connection, silence(silence_s)))
    try:
        return await connection_events_until(connection, "response.done")
    finally:
        listening.cancel()


async def key_usage(stack: GatewayProcess, key_id: str, requests: int) -> dict[str, Any]:
    """The key's usage once ``requests`` are recorded (they are, just after each ends)."""
    deadline = time.monotonic() + 10
    async with httpx.AsyncClient(base_url=stack.base_url, headers=stack.headers) as http:
        while True:
            usage: dict[str, Any] = (await http.get(f"/admin/keys/{key_id}/usage")).json()
            if usage["requests"] >= requests or time.monotonic() > deadline:
                return usage
            await asyncio.sleep(0.2)


VOICE = ["smollm2", "whisper_stt", "piper_tts"]


async def listening(connection: AsyncRealtimeConnection, silence_ms: int) -> None:
    """Server VAD ending a turn after ``silence_ms`` of silence; short answers."""
    vad = {"turn_detection": {"type": "server_vad", "silence_duration_ms": silence_ms}}
    session = {"type": "realtime", "max_output_tokens": 24, "audio": {"input": vad}}
    await connection.session.update(session=session)  # type: ignore[arg-type]


async def assert_billed_once(stack: GatewayProcess, key_id: str, events: list[Any]) -> None:
    """The key's usage is the session, the turn's transcription and its one response, as
    the client was told: nothing else."""
    response = events[-1].response
    usage = await key_usage(stack, key_id, 3)
    assert usage["requests"] == 3
    assert usage["prompt_tokens"] == response.usage.input_tokens
    assert usage["completion_tokens"] == response.usage.output_tokens
    assert usage["audio_seconds_out"] == pytest.approx(pcm_seconds(events), abs=0.05)


async def test_the_answer_made_while_the_user_is_silent_is_sent_and_billed_once(
    stack: GatewayProcess, question: bytes
) -> None:
    created = stack.create_key("ahead", models=VOICE)
    taken, dropped = speculations(stack, "taken"), speculations(stack, "dropped")
    async with connect(stack, created["key"]) as connection:
        await listening(connection, 1500)
        await send_audio(connection, silence(0.3) + question)
        await quiet_until_speculating(stack, connection, 1.0)
        events = await answered_live(connection, b"", 3.0)
    assert speculations(stack, "taken") == taken + 1
    assert speculations(stack, "dropped") == dropped
    # The client sees the turn as always: the answer's events after its turn's.
    order = [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.done",
    ]
    positions = [first(events, kind) for kind in order]
    assert positions == sorted(positions), types(events)
    assert events[-1].response.status in ("completed", "incomplete")
    assert pcm_seconds(events) > 0.3
    # The answer made ahead is the response's, counted once.
    await assert_billed_once(stack, created["id"], events)


async def test_an_answer_started_when_the_user_paused_is_dropped_and_not_billed(
    stack: GatewayProcess, question: bytes
) -> None:
    created = stack.create_key("paused", models=VOICE)
    taken, dropped = speculations(stack, "taken"), speculations(stack, "dropped")
    async with connect(stack, created["key"]) as connection:
        await listening(connection, 1500)
        # A pause shorter than the turn's silence: the guess at the question so far is
        # made and answered, then the user goes on and the answer is dropped.
        await send_audio(connection, silence(0.3) + question)
        await quiet_until_speculating(stack, connection, 1.0)
        assert speculations(stack, "dropped") == dropped
        await send_audio(connection, question)  # the user goes on
        deadline = time.monotonic() + 30
        while metric(stack, "gateway_realtime_speculations_running"):
            assert time.monotonic() < deadline, "the answer made ahead was not dropped"
            await asyncio.sleep(0.1)
        assert speculations(stack, "dropped") == dropped + 1
        # The guess at the whole question is answered ahead too, and that one is taken.
        await quiet_until_speculating(stack, connection, 1.0)
        events = await answered_live(connection, b"", 3.0)
    assert speculations(stack, "dropped") == dropped + 1
    assert speculations(stack, "taken") == taken + 1
    assert types(events).count("response.created") == 1
    assert types(events).count("input_audio_buffer.committed") == 1
    # Nothing of the dropped answer in the key's usage.
    await assert_billed_once(stack, created["id"], events)


async def test_a_client_secret_opens_one_configured_session_and_nothing_else(
    stack: GatewayProcess,
) -> None:
    # A server holds the key and creates the secret; the client holds only the secret.
    created = stack.create_key("app-server", models=["mock_chat", "whisper_stt"])
    instructions = "[mock:say=Ahoy%20from%20the%20secret.]"  # mock_chat says it if it gets it
    secret = await stack.async_client(created["key"]).realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 60},
        session={
            "type": "realtime",
            "model": "mock_chat",
            "instructions": instructions,
            "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}},
        },
    )
    assert secret.value.startswith("ek_") and secret.session.model == "mock_chat"
    assert 50 <= secret.expires_at - time.time() <= 60
    client = stack.async_client(secret.value)
    with pytest.raises(openai.AuthenticationError) as on_rest:
        await client.models.list()
    assert "only opens a Realtime session" in on_rest.value.message
    async with client.realtime.connect(model="mock_chat") as connection:
        opened = await connection_events_until(connection, "session.created")
        assert opened[-1].session.instructions == instructions
        await ask(connection, "Hello?", max_tokens=16)
        events = await connection_events_until(connection, "response.done")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() == "Ahoy from the secret."
    assert events[-1].response.status == "completed"
    # One session per secret, on whichever replica the next connection reaches.
    with pytest.raises(websockets.exceptions.InvalidStatus) as used:
        async with client.realtime.connect(model="mock_chat") as connection:
            await connection.recv()
    assert used.value.response.status_code == 401


async def test_a_phone_call_in_mu_law_is_heard_and_answered_in_mu_law(
    stack: GatewayProcess, question: bytes
) -> None:
    """G.711 as a telephony bridge carries it: the question in 8 kHz mu-law, the answer
    back in 8 kHz mu-law, both read with the standard's own decoder."""
    import audioop  # the standard library's G.711 (deprecated, present in 3.11): an oracle

    narrow, _ = audioop.ratecv(question, 2, 1, PCM_RATE, 8000, None)
    call = audioop.lin2ulaw(silence(0.5)[:8000] + narrow + bytes(2 * 8000 * 6 // 5), 2)
    async with connect(stack) as connection:
        mu_law = {"type": "audio/pcmu"}
        await connection.session.update(
            session={
                "type": "realtime",
                "max_output_tokens": 30,
                "audio": {"input": {"format": mu_law}, "output": {"format": mu_law}},
            }
        )
        for start in range(0, len(call), 800):  # 100 ms of 8 kHz mu-law
            piece = base64.b64encode(call[start : start + 800]).decode()
            await connection.input_audio_buffer.append(audio=piece)
        events = await connection_events_until(connection, "response.done")
    heard = events[first(events, "conversation.item.input_audio_transcription.completed")]
    assert "capital" in heard.transcript.lower() and "france" in heard.transcript.lower()
    answer = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    assert len(answer) > 8000 * 0.3  # one byte a sample at 8 kHz: some speech
    samples = audioop.ulaw2lin(answer, 2)
    assert audioop.rms(samples, 2) > 300  # speech, not silence
    assert events[-1].response.audio.output.format.type == "audio/pcmu"


@pytest.mark.parametrize("sentence", ["Please spell the word cats."])  # ends in a soft "s"
async def test_a_turn_at_real_time_pace_is_heard_as_its_whole_clip(
    stack: GatewayProcess, sentence: str
) -> None:
    """The guess at the transcript starts at the first quiet window and is the turn's
    transcript when no speech follows: it must hear the words' tails (a sentence ending in
    a soft consonant), as Whisper does on the whole clip. Sent as a microphone sends it:
    100 ms appends, each when it is recorded."""
    client = stack.async_client()
    speech = await client.audio.speech.create(
        model="piper_tts", voice="alloy", input=sentence, response_format="pcm"
    )
    whole = await client.audio.transcriptions.create(
        model="whisper_stt", file=("clip.wav", wav_bytes(speech.content, PCM_RATE))
    )
    audio = silence(0.3) + speech.content + silence(1.5)
    async with connect(stack) as connection:
        await connection.session.update(
            session={"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 5}
        )
        start = time.monotonic()
        for offset in range(0, len(audio), CHUNK):
            piece = audio[offset : offset + CHUNK]
            await asyncio.sleep(
                max(0.0, start + (offset + len(piece)) / 2 / PCM_RATE - time.monotonic())
            )
            await connection.input_audio_buffer.append(audio=base64.b64encode(piece).decode())
        events = await connection_events_until(
            connection, "conversation.item.input_audio_transcription.completed"
        )
    heard = events[-1].transcript

    def words(text: str) -> list[str]:
        return re.findall(r"[a-z0-9']+", text.lower())

    assert words(heard) == words(whole.text), (heard, whole.text)
