"""Voice benchmark: from the end of the user's speech to the first byte of the answer's
audio, over the Realtime API, against the same chain called on Triton directly.

Run with ``make bench`` (or ``python -m tests.bench.voice``). It starts the real stack
(nginx, SmolLM2, Piper, Whisper), synthesizes a spoken question with Piper and then:

- **realtime**: ``client.realtime.connect()`` sessions through nginx; the question (its
  trailing silence trimmed) is sent at real-time pace in 100 ms appends, as a browser's
  microphone sends it, then silence flows at the same pace, and the answer is awaited. The
  end of speech is when the last voiced sample of the question was sent. Breakdown: the VAD's wait
  (to ``speech_stopped``), the transcription (to ``...transcription.completed``), the first
  sentence of the answer's text (the last transcript delta before the first audio), and its
  first audio.
- **before and after**: one replica of this code and one of older code (``--baseline``,
  default the code before issue 38, served from a git worktree as in ``tests.bench.cpu``),
  each called straight (no nginx), in turn, at 500 ms, ``--runs`` times each (10): the
  median and the worst run.
- **direct**: the same chain with no gateway and no VAD: Whisper, then SmolLM2 streamed to
  the end of its first sentence, then Piper on that sentence, called through
  ``tritonclient`` (the gateway's own Triton client, in this process).
- **concurrent**: several sessions asking at once, and one session asking while others
  stream silence into their VAD (sessions held open and listening).

Everything shares one 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import openai

from gateway.backend import SamplingOptions, TranscriptionOptions
from gateway.backend.triton import TritonBackend
from gateway.config import Settings
from gateway.serving.audio import decode_to_pcm
from gateway.serving.templating import render_chat
from gateway.serving.voice import SentenceSplitter
from tests.bench.cpu import baseline_replica
from tests.support.audio import wav_bytes
from tests.support.stack import GatewayProcess

#: The code before issue 38 (the Realtime package rebuilt, the guess at the first quiet window).
BASELINE = "6836ad0"

QUESTION = "What is the capital of France?"
RATE = 24_000
PIECE = RATE * 2 // 10  # 100 ms of pcm16
MAX_TOKENS = 40


@dataclass
class Turn:
    """Wall-clock marks of one spoken turn, relative to the end of speech."""

    marks: dict[str, float] = field(default_factory=dict)

    def since_end(self, name: str) -> float:
        return self.marks[name] - self.marks["speech_end"]


def last_voiced_s(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
    voiced = np.nonzero(np.abs(samples) > 500)[0]
    return float(voiced[-1] + 1) / RATE


async def spoken_turn(
    client: openai.AsyncOpenAI, question: bytes, silence_ms: int, idle: bool = False
) -> Turn:
    turn = Turn()
    lead = bytes(RATE * 2 * 3 // 10)  # 0.3 s of silence first
    audio = lead + question + bytes(RATE * 2 * 2)  # then 2 s of silence
    speech_end_at = (len(lead) / 2 / RATE) + last_voiced_s(question)
    async with client.realtime.connect(model="smollm2") as connection:
        session: dict[str, Any] = {"type": "realtime", "max_output_tokens": MAX_TOKENS}
        session["audio"] = {"input": {"turn_detection": {"silence_duration_ms": silence_ms}}}
        await connection.session.update(session=session)  # type: ignore[arg-type]

        async def send(pcm: bytes, forever: bool = False) -> None:
            start = time.monotonic()
            sent = 0
            while True:
                for offset in range(0, len(pcm), PIECE):
                    piece = pcm[offset : offset + PIECE]
                    sent += len(piece)
                    # A microphone has a piece once it is recorded: sent at its end.
                    delay = start + sent / 2 / RATE - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await connection.input_audio_buffer.append(
                        audio=base64.b64encode(piece).decode()
                    )
                if not forever:
                    return

        if idle:  # a session that only listens: silence, all along
            sender = asyncio.create_task(send(bytes(RATE * 2), forever=True))
            try:
                await asyncio.sleep(3600)
            finally:
                sender.cancel()
        start = time.monotonic()
        turn.marks["speech_end"] = start + speech_end_at
        sender = asyncio.create_task(send(audio))
        last_text = 0.0
        try:
            async for event in connection:
                now = time.monotonic()
                kind = event.type
                if kind == "input_audio_buffer.speech_stopped":
                    turn.marks.setdefault("vad", now)
                elif kind == "conversation.item.input_audio_transcription.completed":
                    turn.marks.setdefault("stt", now)
                elif kind == "response.output_audio_transcript.delta":
                    last_text = now
                elif kind == "response.output_audio.delta" and "audio" not in turn.marks:
                    # The first piece spoken was complete with the last text before it.
                    turn.marks["audio"] = now
                    turn.marks["sentence"] = last_text or now
                elif kind == "response.done":
                    break
                elif kind == "error":
                    raise RuntimeError(event.error.message)
        finally:
            sender.cancel()
    return turn


async def direct_chain(url: str, question_16k: np.ndarray) -> dict[str, float]:
    backend = TritonBackend(url)
    try:
        models = {m.name: m for m in await backend.models()}
        start = time.monotonic()
        segments = backend.transcribe("whisper_stt", question_16k, TranscriptionOptions())
        text = "".join([s.text async for s in segments]).strip()
        stt = time.monotonic()
        settings = Settings(_env_file=None)  # type: ignore[call-arg]
        messages = [
            {"role": "system", "content": settings.realtime_instructions},
            {"role": "user", "content": text},
        ]
        prompt = render_chat(models["smollm2"].chat_template or "", messages)
        options = SamplingOptions(max_tokens=MAX_TOKENS, temperature=0.6)
        splitter = SentenceSplitter()
        sentence = ""
        chunks = backend.generate("smollm2", prompt, options, stream=True)
        async for chunk in chunks:
            done = splitter.feed(chunk.text)
            if done:
                sentence = done[0]
                break
        await chunks.aclose()
        sentence = sentence or " ".join(splitter.finish())
        first_sentence = time.monotonic()
        audio = backend.synthesize("piper_tts", sentence, "joe", 1.0)
        await anext(audio)
        first_audio = time.monotonic()
        await audio.aclose()
        return {
            "stt": stt - start,
            "sentence": first_sentence - stt,
            "audio": first_audio - first_sentence,
            "total": first_audio - start,
        }
    finally:
        await backend.close()


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f}"


def row(name: str, turns: list[Turn]) -> str:
    vad = [t.since_end("vad") for t in turns]
    stt = [t.marks["stt"] - t.marks["vad"] for t in turns]
    sentence = [t.marks["sentence"] - t.marks["stt"] for t in turns]
    audio = [t.marks["audio"] - t.marks["sentence"] for t in turns]
    total = [t.since_end("audio") for t in turns]
    return (
        f"| {name} | {ms(vad)} | {ms(stt)} | {ms(sentence)} | {ms(audio)} | "
        f"**{ms(total)}** | {max(total) * 1000:.0f} |"
    )


async def run(
    stack: GatewayProcess, runs: int, baseline: str | None, baseline_ref: str | None
) -> None:
    client = stack.async_client()
    speech = await client.audio.speech.create(
        model="piper_tts", voice="alloy", input=QUESTION, response_format="pcm"
    )
    question = speech.content
    question = question[: round(last_voiced_s(question) * RATE) * 2]  # Piper's tail trimmed
    await spoken_turn(client, question, 500)  # warm-up: every model has run once

    print(f"\nSpoken question: '{QUESTION}' ({len(question) / 2 / RATE:.2f} s), {runs} runs each,")
    print(f"answers of at most {MAX_TOKENS} tokens; milliseconds, medians and the worst run.\n")
    print(
        "| path | VAD wait | transcription | first sentence of text | first audio | "
        "end of speech -> first audio, median | worst |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for silence_ms in (500, 300):
        turns = [await spoken_turn(client, question, silence_ms) for _ in range(runs)]
        print(row(f"realtime, silence_duration_ms={silence_ms}", turns), flush=True)
    if baseline is not None:
        # One replica of this code and one of the older code, straight (no nginx), in turn.
        address = stack.replica_addresses()[0]
        now, before = (
            openai.AsyncOpenAI(base_url=f"http://{where}/v1", api_key=stack.admin_key)
            for where in (address, baseline)
        )
        async with httpx.AsyncClient(base_url=f"http://{baseline}") as http:
            for _ in range(600):  # it loads the models' contracts from Triton first
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/health/ready")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        await spoken_turn(before, question, 500)  # warm-up
        mine: list[Turn] = []
        theirs: list[Turn] = []
        for _ in range(runs):
            theirs.append(await spoken_turn(before, question, 500))
            mine.append(await spoken_turn(now, question, 500))
        print(row(f"one replica, code before ({baseline_ref}), silence 500", theirs))
        print(row("one replica, this code, silence 500", mine), flush=True)
    question_16k = decode_to_pcm(wav_bytes(question, RATE))
    direct = [await direct_chain(stack.triton_grpc, question_16k) for _ in range(runs)]
    print(
        f"| direct Triton chain (no VAD, no gateway) | — | {ms([d['stt'] for d in direct])} | "
        f"{ms([d['sentence'] for d in direct])} | {ms([d['audio'] for d in direct])} | "
        f"{ms([d['total'] for d in direct])} (after the audio is complete) | "
        f"{max(d['total'] for d in direct) * 1000:.0f} |"
    )

    print("\nConcurrent sessions (silence_duration_ms=500), end of speech -> first audio:\n")
    print("| sessions | asking at once | median | max |")
    print("| --- | --- | --- | --- |")
    for asking in (2, 4):
        turns = await asyncio.gather(*(spoken_turn(client, question, 500) for _ in range(asking)))
        total = [t.since_end("audio") for t in turns]
        print(f"| {asking} | {asking} | {ms(total)} | {max(total) * 1000:.0f} |")
    for listening in (10, 25):
        idle = [
            asyncio.create_task(spoken_turn(client, question, 500, idle=True))
            for _ in range(listening)
        ]
        await asyncio.sleep(2)
        try:
            turns = [await spoken_turn(client, question, 500) for _ in range(3)]
        finally:
            for task in idle:
                task.cancel()
            await asyncio.gather(*idle, return_exceptions=True)
        total = [t.since_end("audio") for t in turns]
        print(
            f"| {listening + 1} ({listening} streaming silence) | 1 | {ms(total)} | "
            f"{max(total) * 1000:.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--baseline", default=BASELINE, help="git ref, or 'none'")
    args = parser.parse_args()
    ref = None if args.baseline == "none" else args.baseline
    stack = GatewayProcess(models=["smollm2", "piper_tts", "whisper_stt"]).start()
    try:
        stack.wait_ready()
        with ExitStack() as context:
            baseline = context.enter_context(baseline_replica(stack, ref)) if ref else None
            asyncio.run(run(stack, args.runs, baseline[1] if baseline else None, ref))
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
